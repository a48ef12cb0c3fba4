"""The trace viewer's pictures: timeline, KV lineage, message graph, call detail, totals.

Every function takes a loaded `Trace` (see `trace_file`) and returns a rich
renderable; widths come from the console at render time, so the same views fit
an 80-column terminal, a 200-column one and an SVG export.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from math import inf

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from corps.engine.sched.cost import StepCost
from corps.engine.trace.events import Step
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
        yield Text(" " * label_w) + _axis(t0, t1, width)
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


def _axis(t0: float, t1: float, width: int, unit: str = "s") -> Text:
    ticks = max(2, width // 14)
    line = [" "] * width
    for i in range(ticks):
        x = round(i * (width - 1) / (ticks - 1))
        value = t0 + (t1 - t0) * x / max(1, width - 1)
        label = f"|{value:.2f}s" if unit == "s" else f"|{value:.0f}"
        x = min(x, width - len(label))
        line[x : x + len(label)] = label
    return Text("".join(line[:width]), style="dim")


# ---- KV lineage ----


def segments(trace: Trace, c: CallRec) -> list[tuple[str, int, int, str]]:
    """The call's prompt as (what, start, end, style): its parents where they sat (reused
    in choreographed mode; re-rendered as text, maybe prefix-cached, in baseline), its
    own new tokens, and what it generated."""
    e = c.end
    if e is None:
        return []
    out = []
    for mid, off in sorted(zip(e.parents, e.offsets, strict=False), key=lambda p: p[1]):
        msg = trace.messages.get(mid)
        n = msg.tokens if msg is not None else 0
        out.append((f"m{mid}", off, off + n, "cyan"))
    start = e.new_offset or 0
    own = _own_tokens(trace, c) or max(0, e.encoded - e.generated)
    out.append(("new", start, start + own, "yellow"))
    if e.generated:
        out.append(("gen", start + own, start + own + e.generated, "green"))
    return out


def _own_tokens(trace: Trace, c: CallRec) -> int:
    msg = trace.messages.get(c.end.message) if c.end and c.end.message is not None else None
    return 0 if msg is None else msg.tokens - (c.end.generated if c.end else 0)


def lineage(trace: Trace, flt: Filter = ALL, limit: int = 40) -> Table:
    names = names_of(trace)
    rows = [c for c in calls(trace, flt) if c.end is not None]
    table = Table(
        box=box.SIMPLE_HEAD,
        title="KV lineage: each call's prompt as reused / newly encoded / generated",
    )
    groups = group_of(trace)
    for col, just in (
        ("call", "right"),
        ("group", "left"),
        ("agent", "left"),
        ("kind", "left"),
        ("prompt segments (message@start..end)", "left"),
        ("reuse", "right"),
        ("saved", "right"),
    ):
        short = col.split(" ")[0]  # a header wraps between words, never inside one
        table.add_column(col, justify=just, overflow="fold", min_width=len(short))
    for c in rows[:limit]:
        e = c.end
        segs = Text()
        for what, a, b, style in segments(trace, c):
            if segs:
                segs.append(" ")
            segs.append(f"{what}@{a}..{b}", style=style)
        total = e.reused + e.encoded
        ratio = f"{e.reused / total:.0%}" if total else "-"
        status = "" if e.status == "ok" else f" [{e.status}]"
        row = (cid(c.id), groups.get(c.id, ""), names.lane(c), c.kind + status)
        table.add_row(*row, segs, ratio, f"{e.reused} tok")
    if len(rows) > limit:
        table.caption = f"{len(rows) - limit} more calls: narrow with --agent/--kind/--since"
    return table


# ---- message graph ----


def depths(trace: Trace) -> dict[int, int]:
    """Each message's round: 0 for roots, else 1 + its deepest parent's."""
    out: dict[int, int] = {}
    for mid in sorted(trace.messages):
        parents = [out.get(p, 0) for p in trace.messages[mid].parents]
        out[mid] = 1 + max(parents) if parents else 0
    return out


def readers(trace: Trace) -> dict[int, list[int]]:
    out: dict[int, list[int]] = defaultdict(list)
    for mid, msg in trace.messages.items():
        for p in msg.parents:
            out[p].append(mid)
    return out


def graph(trace: Trace, flt: Filter = ALL, limit: int = 60) -> Table:
    names = names_of(trace)
    depth, read_by = depths(trace), readers(trace)
    leaked = {lk.parent for lk in trace.leaks}
    table = Table(
        box=box.SIMPLE_HEAD, title="message graph (by round): parents in order, with their offsets"
    )
    for col in ("round", "msg", "role", "owner", "visibility", "parents@offset", "read by", ""):
        table.add_column(col, overflow="fold", min_width=len(col))
    shown = [
        m
        for m in trace.messages.values()
        if flt.agent is None or flt.agent in (m.owner or "(engine)")
    ]
    shown.sort(key=lambda m: (depth[m.id], m.id))
    for m in shown[:limit]:
        marks = []
        if len(m.parents) > 1:
            marks.append("join")
        if len(read_by.get(m.id, [])) > 1:
            marks.append(f"fork x{len(read_by[m.id])}")
        if m.view_of is not None:
            marks.append(f"clean copy of m{m.view_of}")
        if m.id in trace.freed:
            marks.append("freed")
        style = "red" if m.id in leaked else ""
        parents = " ".join(f"m{p}@{o}" for p, o in zip(m.parents, m.offsets, strict=False))
        table.add_row(
            str(depth[m.id]),
            Text(f"m{m.id}", style=style),
            m.role,
            names(m.owner),
            m.visibility,
            parents or "-",
            " ".join(f"m{r}" for r in read_by.get(m.id, [])) or "-",
            Text(", ".join(marks), style=style or "dim"),
        )
    if len(shown) > limit:
        table.caption = f"{len(shown) - limit} more messages"
    return table


def leak_path(trace: Trace, start: int, target: int) -> list[int]:
    """Message ids from `start` back through parents to `target` (shortest), or []."""
    prev: dict[int, int | None] = {start: None}
    frontier = [start]
    while frontier:
        nxt = []
        for mid in frontier:
            if mid == target:
                path = [mid]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return path[::-1]
            msg = trace.messages.get(mid)
            for p in msg.parents if msg else ():
                if p not in prev:
                    prev[p] = mid
                    nxt.append(p)
        frontier = nxt
    return []


def problems(trace: Trace) -> Group:
    """Leaks (with the path by which each hidden source reached the reader) and errors."""
    names = names_of(trace)
    parts: list = []
    seen: dict[tuple, list[int | None]] = defaultdict(list)
    for lk in trace.leaks:
        seen[(lk.reader, lk.parent, tuple(lk.sources), lk.policy, lk.call)].append(lk.call_id)
    for (reader, parent, sources, policy, call), ids in seen.items():
        kind = call.split(" by ")[0]
        which = ", ".join(cid(i) for i in ids if i is not None)
        calls = f" (call{'s' if len(ids) > 1 else ''} {which})" if which else ""
        line = Text(f"leak ({policy}): {names(reader)}'s {kind}{calls} ", "red")
        line.append(f"attended to m{parent}, whose encoding carries ")
        for src in sources:
            msg = trace.messages.get(src)
            who = f"{names(msg.owner)}'s {msg.visibility} {msg.role}" if msg else "?"
            path = leak_path(trace, parent, src)
            line.append(f"m{src} ({who}) via ", style="bold red")
            line.append(" <- ".join(f"m{p}" for p in path) or "?", style="red")
            line.append("; ")
        parts.append(line)
    for c in trace.calls.values():
        if c.status == "error":
            parts.append(
                Text(f"error: call {cid(c.id)} ({names.lane(c)}): {c.end.error}", "bold red")
            )
    for a in trace.actors:
        if not a.ok:
            parts.append(Text(f"{a.event}: {names(a.agent)}: {a.detail}", "red"))
    for e in trace.errors:
        parts.append(Text(f"error in {e.where}: {e.detail}", "bold red"))
    for r in trace.reencodes:
        parts.append(Text(f"re-encoded m{r.message} for {names(r.reader)} as m{r.clean}", "dim"))
    for w in trace.switches:
        who = f"{w.workflow or 'no workflow'} / {names(w.agent or None)}"
        line = f"repair auto: {who}: {w.before} -> {w.after} ({w.why}; audited gap {w.gap:.4f})"
        parts.append(Text(line, "yellow"))
    if not parts:
        parts.append(Text("no leaks, no errors", style="green"))
    return Group(Text("leaks and errors", style="bold"), *parts)


# ---- per-call detail ----


def call_detail(trace: Trace, call_id: int, full: bool = False) -> Group:
    """The context as the model saw it: parents in position order, gaps, overlaps, texts."""
    c = trace.calls.get(call_id)
    if c is None:
        raise KeyError(call_id)
    names = names_of(trace)
    e = c.end
    head = Text(f"call {cid(c.id)}: {c.kind} by {names.lane(c)} ({c.status})", style="bold")
    if e is None:
        return Group(head, Text("still pending: no context recorded yet", style="cyan"))
    facts = (
        f"queued {c.start:.3f}s · ttft {ms(e.ttft_s)} · decode {ms(e.decode_s)} · "
        f"encoded {e.encoded} · reused {e.reused} · generated {e.generated}"
    )
    if e.repaired:
        facts += f" · repaired {e.repaired} ({e.repair})"
    elif e.repair:
        facts += f" · read a context another call repaired ({e.repair})"
    if e.message is not None:
        facts += f" · made m{e.message}"
    parts: list = [head, Text(facts)]
    audited = next((a.call for a in trace.audits.values() if a.shadow == call_id), None)
    if audited is not None:
        parts.append(Text(f"the shadow of call {cid(audited)}'s fidelity audit: the baseline's "
                          "encoding of its context, freed once compared", style="dim"))  # fmt: skip
    a = trace.audits.get(call_id)
    if a is not None:
        parts.append(Text(
            f"audited against the baseline (shadow call {cid(a.shadow)}): gap {a.gap:.4f} "
            f"nats/token over its first {a.positions} positions, agreement {a.agreement:.0%}",
            style="yellow" if a.agreement < 1 else "green",
        ))  # fmt: skip
    if e.error:
        parts.append(Text(f"error: {e.error}", style="bold red"))
    parts.append(ContextPicture(segments(trace, c)))
    for mid, off in sorted(zip(e.parents, e.offsets, strict=False), key=lambda p: p[1]):
        msg = trace.messages.get(mid)
        text = _clip(trace.text(mid), None if full else 160)
        who = f"{names(msg.owner)}'s {msg.visibility} {msg.role}" if msg else "?"
        parts.append(Text.assemble((f"m{mid} @{off} ", "cyan"), (f"[{who}] ", "dim"), text))
    if e.message is not None:
        text = _clip(trace.text(e.message), None if full else 400)
        parts.append(Text.assemble((f"-> m{e.message} ", "green"), text))
    return Group(*parts)


def _clip(text: str, n: int | None) -> str:
    """Whole when `n` is None, else one line of at most `n` characters."""
    if n is None:
        return text
    text = text.replace("\n", " ⏎ ")
    return text if len(text) <= n else text[: n - 1] + "… (--full)"


class ContextPicture:
    """One row per segment over a shared position axis, like figure 3 of the paper;
    a last row marks gaps (positions nobody fills) and overlaps (filled twice)."""

    def __init__(self, segs: list[tuple[str, int, int, str]]) -> None:
        self.segs = segs

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if not self.segs:
            return
        hi = max(b for _, _, b, _ in self.segs)
        label_w = 14
        width = max(10, options.max_width - label_w - 1)
        scale = width / max(hi, 1)
        cover = [0] * width
        for what, a, b, style in self.segs:
            x0, x1 = int(a * scale), max(int(a * scale) + 1, int(b * scale))
            row = Text(f"{what} {a}..{b}".ljust(label_w)[:label_w])
            row.append(" " * x0)
            row.append("█" * (x1 - x0), style=style)
            yield row
            if what.startswith("m"):
                for x in range(x0, min(x1, width)):
                    cover[x] += 1
        ctx_end = min(
            width, int(min(a for w, a, _, _ in self.segs if not w.startswith("m")) * scale)
        )
        marks = Text("gaps/overlaps".ljust(label_w)[:label_w])
        for x in range(width):
            if x < ctx_end and cover[x] == 0:
                marks.append("╌", style="yellow")
            elif cover[x] > 1:
                marks.append("▲", style="bold red")
            else:
                marks.append(" ")
        yield marks
        yield Text("position".ljust(label_w)) + _axis(0, hi, width, unit="pos")


# ---- totals ----


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))]


def totals(trace: Trace, flt: Filter = ALL) -> Table:
    names = names_of(trace)
    now = trace.end_t
    groups: dict[str, list[CallRec]] = defaultdict(list)
    shown = calls(trace, flt)
    for c in shown:
        groups[names.lane(c)].append(c)
    leaks = defaultdict(int)
    for lk in trace.leaks:
        leaks[names(lk.reader)] += 1
    table = Table(box=box.SIMPLE_HEAD, title="totals", padding=(0, 0, 0, 1), pad_edge=False)
    table.add_column("agent", min_width=8, no_wrap=True, overflow="ellipsis")
    for col in ("calls", "encoded", "reused", "gen", "reuse", "TTFT p50/95", "busy"):
        table.add_column(col, justify="right", no_wrap=True)
    for col in ("leaks", "err"):
        table.add_column(col, justify="right", no_wrap=True)
    for name, cs in [*sorted(groups.items()), ("all", shown)]:
        ends = [c.end for c in cs if c.end is not None]
        enc, reu = sum(e.encoded for e in ends), sum(e.reused for e in ends)
        ttfts = [e.ttft_s for e in ends if e.ttft_s is not None]
        n_leaks = sum(leaks.values()) if name == "all" else leaks.get(name, 0)
        n_errors = sum(1 for c in cs if c.status == "error")
        p50, p95 = _pct(ttfts, 0.5), _pct(ttfts, 0.95)
        table.add_row(
            Text(name, style="bold" if name == "all" else ""),
            str(len(cs)),
            str(enc),
            str(reu),
            str(sum(e.generated for e in ends)),
            f"{reu / (enc + reu):.0%}" if enc + reu else "-",
            "-" if p50 is None else f"{p50 * 1000:.0f}/{ms(p95)}",
            f"{busy(cs, now):.2f}s",
            Text(str(n_leaks), style="red" if n_leaks else ""),
            Text(str(n_errors), style="red" if n_errors else ""),
        )
    path = critical_path(trace, shown)
    table.caption_justify = "left"
    table.caption = (
        "busy: time with one of its calls queued or running.  critical path: "
        "-> reads the previous call's message, ~> submitted after it ended"
    )
    if path:
        span = path[-1].stop(now) - path[0].start
        chain = cid(path[0].id) + " " + names(path[0].agent)
        for earlier, later in itertools.pairwise(path):
            arrow = "->" if reads(trace, later, earlier) else "~>"
            chain += f" {arrow} {cid(later.id)} {names(later.agent)}"
        table.caption += f"\ncritical path ({span:.2f} s, {len(path)} calls): {chain}"
    return table


def steps(trace: Trace) -> Table | None:
    """The batching loop's steps per engine (a merged trace's workers apart): how long
    they took, how wide they were, and how much of them was admission. None when the
    trace recorded no steps."""
    by_engine: dict[str | None, list[Step]] = defaultdict(list)
    for st, proc in zip(trace.steps, trace.step_processes, strict=True):
        by_engine[proc].append(st)
    if not by_engine:
        return None
    table = Table(box=box.SIMPLE_HEAD, title="steps", padding=(0, 0, 0, 1), pad_edge=False)
    table.add_column("engine", no_wrap=True)
    cols = ("steps", "ms p50/p99/max", "rows avg/max", "calls avg/max", "left out", "admit")
    for col in (*cols, "queue max", "evicted/recomputed"):
        table.add_column(col, justify="right", no_wrap=True)
    for proc, sts in by_engine.items():
        durs = [st.dur * 1000 for st in sts]
        busy_s = sum(st.dur for st in sts)
        table.add_row(
            proc or "engine",
            str(len(sts)),
            f"{_pct(durs, 0.5):.1f}/{_pct(durs, 0.99):.1f}/{max(durs):.1f}",
            f"{sum(st.rows for st in sts) / len(sts):.1f}/{max(st.rows for st in sts)}",
            f"{sum(st.calls for st in sts) / len(sts):.1f}/{max(st.calls for st in sts)}",
            str(sum(1 for st in sts if st.stepped < st.calls and st.rows)),
            f"{sum(st.admit_s for st in sts) / busy_s:.0%}" if busy_s else "-",
            str(max(st.queue for st in sts)),
            f"{sum(st.evicted for st in sts)}/{sum(st.recomputed for st in sts)}",
        )
    fits = [(proc or "engine", fit) for proc, sts in by_engine.items() if (fit := step_fit(sts))]
    table.caption_justify = "left"
    table.caption = (
        "left out: steps that ran rows of fewer calls than were running (a policy "
        "kept some out to bound the step).  admit: share of step time before the "
        "forward (thread hop, admitting calls, recomputing evicted parents).  "
        "evicted/recomputed: tokens whose encodings were dropped to make room, "
        "and made again to be read"
    )
    for name, fit in fits:  # what widens a step, per engine
        table.caption += f"\n{name}: a step took " + describe_fit(fit)
    return table


def describe_fit(fit: tuple[float, ...]) -> str:
    """`step_fit`'s terms in words; prompt chunks and keys only where they count."""
    fixed, per_call, per_row, per_chunk, per_keys = fit
    text = f"{fixed:.1f} ms + {per_call:.2f} ms a call + {per_row:.3f} ms a row"
    if per_chunk:
        text += f" + {per_chunk:.2f} ms a prompt chunk"
    if per_keys:
        text += f" + {per_keys:.2f} ms per 1000 keys its decodes read"
    return text + " (least squares over its steps)"


def step_fit(steps: list[Step]) -> tuple[float, float, float, float, float] | None:
    """A step's milliseconds fitted on what it ran, over `steps` (least squares, each
    coefficient >= 0, the engine's own `StepCost`): (fixed, per call, per row, per
    prompt chunk, per 1000 keys its decodes read); the last two are 0 in traces
    that do not record them. None when the steps do not have two sizes to tell
    the terms apart."""
    cost = StepCost(decay=1.0)
    for st in steps:
        cost.observe(st.stepped or st.calls, st.rows, st.dur, st.chunks, st.keys)
    coef = cost.coefficients()
    return None if coef is None else tuple(1000 * c for c in coef)  # type: ignore[return-value]


def _union(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Overlapping or touching (start, end) spans merged, in order."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _length(spans: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in spans)


def _within(steps: list[tuple[float, float]], spans: list[tuple[float, float]]) -> list[float]:
    """Durations of the steps, (midpoint, duration) sorted, whose midpoint is in `spans`."""
    return [
        d
        for a, b in spans
        for _, d in steps[bisect_left(steps, (a,)) : bisect_right(steps, (b, inf))]
    ]


@dataclass(frozen=True)
class WorkflowTime:
    """Where one workflow's latency went (from its pass through the workflow gate and
    its calls' queued, admitted and end)."""

    name: str
    calls: int
    latency: float  # arrived at the gate (else first call queued) -> last call ended (s)
    running: float  # s with at least one of its calls admitted and not ended
    queued: float  # s with calls waiting for admission and none running
    between: float  # s with no call of its own queued or running (its code, other waits)
    steps: int  # engine steps during its running time
    step_ms: float  # their mean duration
    gated: float = 0.0  # s waiting at the engine's workflow gate to start


def workflow_times(trace: Trace) -> list[WorkflowTime]:
    """Each workflow of the trace (calls carrying a workflow name), slowest first."""
    now = trace.end_t
    by: dict[str, list[CallRec]] = defaultdict(list)
    for c in trace.calls.values():
        if c.queued.workflow is not None:
            by[c.queued.workflow].append(c)
    steps: dict[str | None, list[tuple[float, float]]] = defaultdict(list)  # per engine
    for st, proc in zip(trace.steps, trace.step_processes, strict=True):
        steps[proc].append((st.t + st.dur / 2, st.dur))  # (midpoint, duration)
    for one in steps.values():
        one.sort()
    out = []
    for name, cs in by.items():
        start, stop = min(c.start for c in cs), max(c.stop(now) for c in cs)
        gate = trace.gates.get(name)
        gated = gate.waited if gate is not None else 0.0
        start = min(start, gate.t - gated) if gate is not None else start
        admitted = [(c.admitted if c.admitted is not None else c.stop(now)) for c in cs]
        run = _union((a, c.stop(now)) for a, c in zip(admitted, cs, strict=True))
        either = _union([*run, *((c.start, a) for a, c in zip(admitted, cs, strict=True))])
        # the steps of the engines its calls ran in, while one of them was running
        durs = [d for proc in {c.process for c in cs} for d in _within(steps[proc], run)]
        out.append(WorkflowTime(
            name, len(cs), stop - start, _length(run), _length(either) - _length(run),
            (stop - start) - _length(either) - gated, len(durs),
            1000 * sum(durs) / len(durs) if durs else 0.0, gated,
        ))  # fmt: skip
    return sorted(out, key=lambda w: -w.latency)


def workflows(trace: Trace, limit: int = 10) -> Table | None:
    """The slowest workflows and where their latency went: waiting at the workflow gate
    (when any did), running (a call of theirs in the engine's steps), queued (waiting
    for admission) or between calls; and the steps they ran in. None when no call
    carries a workflow."""
    times = workflow_times(trace)
    if not times:
        return None
    title = f"workflows (slowest {min(limit, len(times))} of {len(times)})"
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 0, 0, 1), pad_edge=False, title=title)
    table.add_column("workflow", no_wrap=True, overflow="ellipsis", max_width=28)
    gate = any(w.gated > 0 for w in times)
    parts = ("gate",) * gate + ("running", "queued", "between")
    for col in ("calls", "latency s", *parts, "steps", "step ms"):
        table.add_column(col, justify="right", no_wrap=True)
    for w in times[:limit]:
        shares = [f"{x / w.latency:.0%}" if w.latency > 0 else "-"
                  for x in (w.gated,) * gate + (w.running, w.queued, w.between)]  # fmt: skip
        table.add_row(w.name, str(w.calls), f"{w.latency:.2f}", *shares, str(w.steps),
                      f"{w.step_ms:.1f}")  # fmt: skip
    table.caption_justify = "left"
    table.caption = (
        "gate: waiting to start (max_workflows, or the store full); "
        * gate
        + "running: share of its latency with a call of its own admitted (its time then "
        "is the width of the steps it shares: step ms); queued: calls waiting for "
        "admission, none running; between: no call of its own in the engine"
    )
    return table


def busy(cs: Iterable[CallRec], now: float) -> float:
    """Seconds during which at least one of `cs` was queued or running."""
    return _length(_union((c.start, c.stop(now)) for c in cs))


def reads(trace: Trace, c: CallRec, maker: CallRec) -> bool:
    """Whether `c` attended to the message `maker` made."""
    made = maker.end.message if maker.end is not None else None
    parents = c.end.parents if c.end is not None else c.queued.parents
    return made is not None and made in parents


def critical_path(trace: Trace, shown: list[CallRec]) -> list[CallRec]:
    """The chain of calls that bounds the wall time, from the last call to end back.

    A call waited for whichever ended last of: the calls that made its parents, and
    the calls of its run that ended before it was submitted (the workflow's code
    waited on them, e.g. the votes a pattern tallies before the next stage, even
    when the next call does not read them)."""
    now = trace.end_t
    if not shown:
        return []
    names = names_of(trace)
    ended = sorted((x for x in trace.calls.values() if x.end is not None), key=lambda x: x.end.t)
    c = max(shown, key=lambda x: x.stop(now))
    path = [c]
    seen = {c.id}
    while True:
        parents = c.end.parents if c.end is not None else c.queued.parents
        makers = [m for p in parents if (m := trace.producer(p)) is not None and m.id not in seen]
        run = names.run(c.agent)
        before = [
            x
            for x in ended
            if x.end.t <= c.start
            and x.id not in seen
            and (run is None or names.run(x.agent) in (run, None))
        ]
        if not makers and not before:
            return path[::-1]
        # ties go to a call whose message it read: that is the dependency to show
        c = max(makers + before[-1:], key=lambda x: (x.stop(now), reads(trace, c, x)))
        seen.add(c.id)
        path.append(c)


def overview(trace: Trace, flt: Filter = ALL, limit: int = 40) -> Iterator:
    """Everything `corps trace view FILE` shows, in order."""
    yield header(trace)
    yield totals(trace, flt)
    if (table := steps(trace)) is not None:
        yield table
    if (table := workflows(trace)) is not None:
        yield table
    yield Timeline(trace, flt)
    yield lineage(trace, flt, limit)
    yield graph(trace, flt, limit)
    yield problems(trace)
