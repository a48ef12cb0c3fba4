"""The views of totals: per agent and kind, the engine's steps (and the cost model's
fit of them), workflows' time and their critical path."""

from __future__ import annotations

import itertools
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from math import inf

from rich import box
from rich.table import Table
from rich.text import Text

from corps.engine.sched.cost import StepCost
from corps.engine.trace.events import Step
from corps.engine.trace.reader import CallRec, Trace, names_of
from corps.view.timeline import ALL, Filter, calls, cid, ms

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
