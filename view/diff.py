"""`corps trace diff A B`: two runs side by side, calls aligned by agent and step.

A call's key is (agent role, its place among that agent's calls in queue
order), so the same pattern traced in two modes or with two seeds lines up even
though run ids differ. The report gives per-call and total ratios A÷B and the
first aligned call whose output text differs.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from corps.engine.trace.reader import CallRec, Names, Trace
from corps.view.timeline import clip, ms


@dataclass(frozen=True)
class Pair:
    agent: str
    step: int
    a: CallRec | None
    b: CallRec | None


def align(a: Trace, b: Trace) -> list[Pair]:
    """Calls of both traces keyed by (agent role, step), in A's order (B's extras last)."""
    keyed_a, keyed_b = _keyed(a), _keyed(b)
    out = [Pair(agent, step, c, keyed_b.get((agent, step))) for (agent, step), c in keyed_a.items()]
    out += [Pair(ag, st, None, c) for (ag, st), c in keyed_b.items() if (ag, st) not in keyed_a]
    return out


def _keyed(trace: Trace) -> dict[tuple[str, int], CallRec]:
    names = Names([])  # one role name per agent, whatever the run id
    steps: dict[str, int] = {}
    out = {}
    for c in sorted(trace.calls.values(), key=lambda c: (c.start, c.id)):
        agent = names(c.agent)
        steps[agent] = steps.get(agent, 0) + 1
        out[(agent, steps[agent])] = c
    return out


def _ratio(x: float | None, y: float | None) -> str:
    if x is None or y is None or y == 0:
        return "-"
    return f"{x / y:.2f}x"


def _output(trace: Trace, c: CallRec | None) -> str | None:
    if c is None or c.end is None or c.end.message is None:
        return None
    return trace.text(c.end.message)


def diff(a: Trace, b: Trace, limit: int = 60) -> Group:
    pairs = align(a, b)
    table = Table(
        box=box.SIMPLE_HEAD,
        padding=(0, 0, 0, 1),
        pad_edge=False,
        title=f"A = {a.path.name} ({a.header.mode})   B = {b.path.name} ({b.header.mode})",
    )
    table.add_column("agent", min_width=8, no_wrap=True, overflow="ellipsis")
    cols = ("step", "kind", "TTFT A", "TTFT B", "A÷B", "enc A", "enc B", "reused A", "reused B")
    for col in (*cols, "same"):
        table.add_column(col, justify="left" if col == "kind" else "right", no_wrap=True)
    first_diff: Pair | None = None
    for p in pairs:
        ea, eb = p.a.end if p.a else None, p.b.end if p.b else None
        out_a, out_b = _output(a, p.a), _output(b, p.b)
        same = out_a == out_b and out_a is not None
        if not same and first_diff is None and p.a is not None and p.b is not None:
            first_diff = p
        if len(table.rows) >= limit:
            continue
        table.add_row(
            p.agent,
            str(p.step),
            (p.a or p.b).kind,
            ms(ea.ttft_s if ea else None),
            ms(eb.ttft_s if eb else None),
            _ratio(ea.ttft_s if ea else None, eb.ttft_s if eb else None),
            str(ea.encoded) if ea else "-",
            str(eb.encoded) if eb else "-",
            str(ea.reused) if ea else "-",
            str(eb.reused) if eb else "-",
            Text("yes", "green") if same else Text("no", "yellow"),
        )
    if len(pairs) > limit:
        table.caption = f"{len(pairs) - limit} more aligned calls"
    parts: list = [table, _totals(a, b)]
    missing = [p for p in pairs if p.a is None or p.b is None]
    if missing:
        parts.append(Text(f"{len(missing)} calls have no counterpart in the other trace", "yellow"))
    if first_diff is None:
        parts.append(Text("outputs: every aligned call produced the same text", style="green"))
    else:
        p = first_diff
        parts.append(Text(f"first divergence: {p.agent} step {p.step}", style="bold yellow"))
        parts.append(Text.assemble(("A: ", "bold"), clip(_output(a, p.a) or "(none)", 300)))
        parts.append(Text.assemble(("B: ", "bold"), clip(_output(b, p.b) or "(none)", 300)))
    return Group(*parts)


def _totals(a: Trace, b: Trace) -> Table:
    table = Table(box=box.SIMPLE_HEAD, title="totals")
    for col in ("", "A", "B", "A÷B"):
        table.add_column(col, justify="left" if not col else "right")
    fa, fb = _figures(a), _figures(b)
    for key, fmt in (
        ("calls", str),
        ("encoded", str),
        ("reused", str),
        ("generated", str),
        ("mean TTFT", ms),
        ("wall", lambda s: f"{s:.2f}s"),
    ):
        table.add_row(key, fmt(fa[key]), fmt(fb[key]), _ratio(fa[key], fb[key]))
    return table


def _figures(trace: Trace) -> dict[str, float]:
    ends = [c.end for c in trace.calls.values() if c.end is not None]
    ttfts = [e.ttft_s for e in ends if e.ttft_s is not None]
    calls = list(trace.calls.values())
    wall = max((c.stop(trace.end_t) for c in calls), default=0.0) - min(
        (c.start for c in calls), default=0.0
    )
    return {
        "calls": len(calls),
        "encoded": sum(e.encoded for e in ends),
        "reused": sum(e.reused for e in ends),
        "generated": sum(e.generated for e in ends),
        "mean TTFT": sum(ttfts) / len(ttfts) if ttfts else None,
        "wall": wall,
    }
