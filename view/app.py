"""`corps trace ui FILE [--follow]`: the trace viewer as an interactive Textual app.

The same data (`Trace`) and the same rich renderers as `corps trace view`
(`corps.view`), arranged to navigate: the header and timeline on top;
below, a table of calls (one row each, in start order) beside the selected
call's detail (its context picture, its parents' texts in full, what it made);
other tabs hold the totals with the critical path, the loop's steps and the
slowest workflows, the message graph and the leaks and errors. `/` filters by
agent; with `--follow` (or `f`) the app reads what a running `corps run --trace
FILE` appends, twice a second.
"""

from __future__ import annotations

from typing import ClassVar

from rich.console import Group
from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import DataTable, Footer, Input, Static, TabbedContent, TabPane

from corps import view as tv
from corps.engine.trace.reader import Trace

FOLLOW_S = 0.5  # seconds between reads of a followed file
TABS = ("tab-calls", "tab-totals", "tab-messages", "tab-problems")


class TraceApp(App[None]):
    """Browse one trace: calls on the left, the selected call's detail on the right."""

    TITLE = "corps trace ui"
    CSS = """
    #top { height: auto; max-height: 45%; }
    #calls { width: 64; }
    #detail { width: 1fr; padding: 0 1; }
    #filter { display: none; }
    #filter.shown { display: block; }
    """
    BINDINGS: ClassVar = [
        Binding("q", "quit", "quit"),
        Binding("slash", "filter", "filter by agent"),
        Binding("escape", "clear_filter", "clear filter", show=False),
        Binding("f", "toggle_follow", "follow"),
        Binding("r", "reload", "reload"),
    ]

    def __init__(self, trace: Trace, *, follow: bool = False) -> None:
        super().__init__()
        self.trace = trace
        self.follow = follow
        self.flt = tv.ALL
        self.selected: int | None = None
        self._timer = None
        self.stale: set[str] = set(TABS)  # tabs to draw again when next shown

    # ---- layout ----

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="top"):
            yield Static(id="header")
            yield Static(id="timeline")
        yield Input(placeholder="agent name contains… (Enter applies, Esc clears)", id="filter")
        with TabbedContent(initial="tab-calls"):
            with TabPane("calls", id="tab-calls"), Horizontal():
                yield DataTable(id="calls", cursor_type="row", zebra_stripes=True)
                with VerticalScroll(id="detail"):
                    yield Static(id="call")
            with TabPane("totals", id="tab-totals"), VerticalScroll():
                yield Static(id="totals")
            with TabPane("messages", id="tab-messages"), VerticalScroll():
                yield Static(id="graph")
            with TabPane("leaks & errors", id="tab-problems"), VerticalScroll():
                yield Static(id="problems")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#calls", DataTable)
        for col in ("call", "group", "agent", "kind", "status", "start", "TTFT", "gen", "reuse"):
            table.add_column(col, key=col)
        self.redraw()
        if self.follow:
            self._start_following()
        table.focus()

    # ---- drawing ----

    def redraw(self) -> None:
        """The header, the timeline and the open tab from the trace as read so far (the
        selected call stays selected); the other tabs when they are opened: a followed
        trace redraws often, and a long one's message graph is slow to lay out."""
        trace, flt = self.trace, self.flt
        self.sub_title = f"{trace.path.name}{'  ·  following' if self.follow else ''}"
        self.query_one("#header", Static).update(tv.header(trace))
        self.query_one("#timeline", Static).update(tv.Timeline(trace, flt))
        self.stale = set(TABS)
        self._draw_tab(self.query_one(TabbedContent).active)

    def _draw_tab(self, tab: str) -> None:
        """Draw one tab's contents if the trace or filter changed since it was drawn."""
        if tab not in self.stale:
            return
        self.stale.discard(tab)
        trace, flt = self.trace, self.flt
        if tab == "tab-calls":
            self._fill_calls()
            self._show_call()
        elif tab == "tab-totals":  # below the totals: the loop's steps, the slowest workflows
            below = [t for t in (tv.steps(trace), tv.workflows(trace)) if t is not None]
            self.query_one("#totals", Static).update(Group(tv.totals(trace, flt), *below))
        elif tab == "tab-messages":
            self.query_one("#graph", Static).update(tv.graph(trace, flt, limit=10**6))
        elif tab == "tab-problems":
            self.query_one("#problems", Static).update(tv.problems(trace))

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if event.pane.id is not None:
            self._draw_tab(event.pane.id)

    def _fill_calls(self) -> None:
        table = self.query_one("#calls", DataTable)
        names, groups = tv.names_of(self.trace), tv.group_of(self.trace)
        rows = tv.calls(self.trace, self.flt)
        table.clear()
        for c in rows:
            e = c.end
            total = e.reused + e.encoded if e else 0
            table.add_row(
                tv.cid(c.id),
                groups.get(c.id, ""),
                names.lane(c),
                c.kind,
                Text(c.status, style=_STATUS.get(c.status, "")),
                f"{c.start:.2f}s",
                tv.ms(e.ttft_s if e else None),
                str(e.generated) if e else "-",
                f"{e.reused / total:.0%}" if total else "-",
                key=str(c.id),
            )
        ids = [c.id for c in rows]
        if self.selected not in ids:
            self.selected = ids[0] if ids else None
        if self.selected is not None:
            table.move_cursor(row=ids.index(self.selected))

    def _show_call(self) -> None:
        pane = self.query_one("#call", Static)
        if self.selected is None or self.selected not in self.trace.calls:
            pane.update(Text("no calls to show", style="dim"))
            return
        detail = tv.call_detail(self.trace, self.selected, full=True)
        pane.update(Group(detail, Text(""), _readers(self.trace, self.selected)))

    # ---- events ----

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key.value is not None:
            self.selected = int(event.row_key.value)
            self._show_call()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        value = event.value.strip()
        self.flt = tv.Filter(agent=value or None)
        self.query_one("#filter", Input).remove_class("shown")
        self.redraw()
        self.query_one("#calls", DataTable).focus()

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.add_class("shown")
        box.focus()

    def action_clear_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.value = ""
        box.remove_class("shown")
        self.flt = tv.ALL
        self.redraw()
        self.query_one("#calls", DataTable).focus()

    def action_toggle_follow(self) -> None:
        self.follow = not self.follow
        if self.follow:
            self._start_following()
        elif self._timer is not None:
            self._timer.stop()
            self._timer = None
        self.redraw()

    def action_reload(self) -> None:
        self.poll()

    def _start_following(self) -> None:
        if self._timer is None:
            self._timer = self.set_interval(FOLLOW_S, self.poll)

    def poll(self) -> int:
        """Read what was appended since the last read; redraw if anything was."""
        n = self.trace.update()
        if n:
            self.redraw()
        return n


_STATUS = {"ok": "green", "error": "bold red", "cancelled": "red", "pending": "cyan"}


def _readers(trace: Trace, call_id: int) -> Text:
    """Which calls read what this call made (the other end of its arrows)."""
    c = trace.calls[call_id]
    made = c.end.message if c.end is not None else None
    if made is None:
        return Text("")
    readers = [r for r in tv.calls(trace) if tv.reads(trace, r, c)]
    if not readers:
        return Text(f"m{made} is read by no call (yet)", style="dim")
    names = tv.names_of(trace)
    who = ", ".join(f"{tv.cid(r.id)} {names(r.agent)}" for r in readers)
    return Text(f"m{made} is read by {who}", style="cyan")
