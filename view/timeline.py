"""The trace viewer's header and timeline, and what every view shares: which calls it
shows (`Filter`), their ids and times as text.

Every view takes a loaded `Trace` (`corps.engine.trace.reader`) and returns a rich
renderable; widths come from the console at render time, so the same views fit
an 80-column terminal, a 200-column one and an SVG export.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass

from rich.console import Console, ConsoleOptions, RenderResult
from rich.panel import Panel
from rich.text import Text

from corps.engine.trace.reader import CallRec, Trace, names_of

#: How the timeline draws each phase of a call.
QUEUE, PREFILL, FIRST, DECODE, PENDING = (
    ("·", "dim"),
    ("▒", "yellow"),
    ("┃", "bold magenta"),
    (
        "█",
        "green",
    ),
    ("░", "cyan"),
)
MAX_LANES = 8  # sub-rows per agent for overlapping calls; more are drawn over the last


@dataclass(frozen=True)
class Filter:
    """Which calls a view shows: agent name contains `agent`, of `kind`, ending after `since`."""

    agent: str | None = None
    kind: str | None = None
    since: float | None = None

    def keep(self, c: CallRec, now: float) -> bool:
        if self.agent is not None and self.agent not in (c.agent or "(engine)"):
            return False
        if self.kind is not None and c.kind != self.kind:
            return False
        return self.since is None or c.stop(now) >= self.since


ALL = Filter()


def calls(trace: Trace, flt: Filter = ALL) -> list[CallRec]:
    now = trace.end_t
    return sorted((c for c in trace.calls.values() if flt.keep(c, now)), key=lambda c: c.start)


def cid(call_id: int) -> str:
    """How the viewer names a call: `c14` (a message is `m14`)."""
    return f"c{call_id}"


def group_of(trace: Trace) -> dict[int, str]:
    """Call id -> `g12` for calls submitted in a task group of two or more (the group
    is named by its first call), for the views to show which calls were admitted
    together."""
    members: dict[int, list[int]] = defaultdict(list)
    for c in trace.calls.values():
        if c.queued.group is not None:
            members[c.queued.group].append(c.id)
    return {cid: f"g{g}" for g, ids in members.items() if len(ids) > 1 for cid in ids}


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}ms"


# ---- header ----


def header(trace: Trace) -> Panel:
    h = trace.header
    pending = sum(1 for c in trace.calls.values() if c.end is None)
    line = Text.assemble(
        ("corps trace ", "bold"),
        f"{trace.path.name}  ·  model {h.model}  ·  mode {h.mode}  ·  {h.dtype} on {h.device}  ·  ",
        f"policy {h.policy}  ·  " if h.policy else "",
        f"corps {h.corps}  ·  {trace.events} events over {trace.end_t:.2f} s",
    )
    if pending:
        line.append(f"  ·  {pending} calls pending", style="cyan")
    if not trace.closed:
        line.append("  ·  not closed: still running, or the run was interrupted", style="yellow")
    for w in trace.warnings:
        line.append(f"\nwarning: {w}", style="yellow")
    return Panel(line, expand=True)


# ---- timeline ----


class Timeline:
    """One lane per agent; each call a bar: queue · prefill ▒ first token ┃ decode █."""

    def __init__(self, trace: Trace, flt: Filter = ALL) -> None:
        self.trace = trace
        self.calls = calls(trace, flt)
        self.names = names_of(trace)
        self.leaky = {lk.call_id for lk in trace.leaks}

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if not self.calls:
            yield Text("no calls to show", style="dim")
            return
        now = self.trace.end_t
        t0 = min(c.start for c in self.calls)
        t1 = max(max(c.stop(now) for c in self.calls), t0 + 1e-6)
        lanes = self._lanes()
        label_w = min(22, max(len(name) for name in lanes) + 1)
        width = max(10, options.max_width - label_w - 1)
        scale = width / (t1 - t0)

        def cell(t: float) -> int:
            return min(width - 1, max(0, int((t - t0) * scale)))

        yield Text.assemble(("timeline ", "bold"), _legend())
        stacked = 0
        for name, rows in lanes.items():
            for i, row in enumerate(rows):
                label = name if i == 0 else ""
                if i == MAX_LANES - 1 and _overlapping(row, now):
                    stacked += _overlapping(row, now)
                    label = f"  +{_overlapping(row, now)} stacked"
                label = label.ljust(label_w)[:label_w]
                line = Text(label, style="bold" if i == 0 else "")
                line.append_text(self._row(row, cell, width, now))
                yield line
        yield Text(" " * label_w) + axis(t0, t1, width)
        if stacked:
            yield Text(
                f"+N stacked: an agent ran more than {MAX_LANES} calls at once; the extra "
                "ones are drawn over its last row (the KV lineage lists every call)",
                style="dim",
            )

    def _lanes(self) -> dict[str, list[list[CallRec]]]:
        """Per agent, rows of calls that do not overlap (greedy, by start time)."""
        now = self.trace.end_t
        lanes: dict[str, list[list[CallRec]]] = {}
        for c in self.calls:
            rows = lanes.setdefault(self.names.lane(c), [])
            for row in rows:
                if row[-1].stop(now) <= c.start:
                    row.append(c)
                    break
            else:
                if len(rows) < MAX_LANES:
                    rows.append([c])
                else:
                    rows[-1].append(c)  # drawn over: the lane is at its limit
        if self.trace.processes:  # a merged trace: each process's lanes together
            order = {p.name: i for i, p in enumerate(self.trace.processes)}
            rank = {name: order.get(rows[0][0].process, -1) for name, rows in lanes.items()}
            lanes = dict(sorted(lanes.items(), key=lambda kv: rank[kv[0]]))
        return lanes

    def _row(self, row: list[CallRec], cell, width: int, now: float) -> Text:
        chars = [" "] * width
        styles = [""] * width
        for c in row:
            end = c.stop(now)
            admitted = c.admitted if c.admitted is not None else (c.first or end)
            first = c.first
            spans = [(c.start, admitted, QUEUE)]
            if c.end is None:
                spans.append((admitted, end, PENDING))
            elif first is not None:
                spans += [(admitted, first, PREFILL), (first, end, DECODE)]
            else:
                spans.append((admitted, end, PREFILL))
            for a, b, (ch, st) in spans:
                if c.status == "error" or c.id in self.leaky:
                    st = "bold red"
                elif c.status == "cancelled":
                    st = "dim red"
                for x in range(cell(a), max(cell(a), cell(b) - 1) + 1):
                    if b > a or x == cell(a):
                        chars[x], styles[x] = ch, st
            if first is not None and c.end is not None:
                chars[cell(first)], styles[cell(first)] = FIRST
        text = Text()
        for ch, st in zip(chars, styles, strict=True):
            text.append(ch, style=st)
        return text


def _overlapping(row: list[CallRec], now: float) -> int:
    """How many calls of a row start before the previous one ended (drawn over)."""
    return sum(1 for a, b in itertools.pairwise(row) if b.start < a.stop(now))


def _legend() -> Text:
    parts = [("queue", QUEUE), ("prefill", PREFILL), ("first token", FIRST), ("decode", DECODE)]
    parts.append(("pending", PENDING))
    text = Text()
    for label, (ch, st) in parts:
        text.append(ch * 2, style=st)
        text.append(f" {label}  ")
    text.append("(red: failed or leaked)", style="red")
    return text


def axis(t0: float, t1: float, width: int, unit: str = "s") -> Text:
    ticks = max(2, width // 14)
    line = [" "] * width
    for i in range(ticks):
        x = round(i * (width - 1) / (ticks - 1))
        value = t0 + (t1 - t0) * x / max(1, width - 1)
        label = f"|{value:.2f}s" if unit == "s" else f"|{value:.0f}"
        x = min(x, width - len(label))
        line[x : x + len(label)] = label
    return Text("".join(line[:width]), style="dim")


def clip(text: str, n: int | None) -> str:
    """Whole when `n` is None, else one line of at most `n` characters."""
    if n is None:
        return text
    text = text.replace("\n", " ⏎ ")
    return text if len(text) <= n else text[: n - 1] + "… (--full)"
