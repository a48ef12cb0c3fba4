"""Exporting a trace to tools people already use: Perfetto, SVG and HTML.

- `perfetto(trace)`: the Chrome trace event format (`{"traceEvents": [...]}`),
  which ui.perfetto.dev and chrome://tracing open: one process, one thread per
  agent and lane (an agent's overlapping calls get lanes of their own, as the
  terminal viewer's sub-rows), a complete event (`ph: "X"`) per call with its
  phases nested inside, flow arrows from the call that made a message to the
  calls that read it, and counter tracks for store occupancy and batch size.
  Perfetto binds a flow event to the slice open at its timestamp on its
  thread, so each arrow starts inside its maker's call and ends inside its
  reader's, each alone on its lane.
- OpenTelemetry: `corps.engine.trace.spans.otlp(trace)` builds the spans (GenAI
  conventions) and `corps.engine.trace.exporter.send` hands them to the SDK's OTLP
  exporter; they live in the engine layer because `Engine.open(otel=URL)` sends
  the same spans live.
- `record(trace, width)`: the viewer recorded by rich, for `export_svg` / `export_html`.
"""

from __future__ import annotations

import io
import re
from typing import Any

from rich.console import Console

from corps.engine.trace.events import Step
from corps.engine.trace.reader import CallRec, Trace
from corps.view import ALL, Filter, Timeline, overview


def _us(t: float) -> float:
    return round(t * 1e6, 3)


# ---- Perfetto / Chrome trace events ----


def perfetto(trace: Trace) -> dict[str, Any]:
    h = trace.header
    # one Perfetto process per engine: a merged trace's workers, else the one engine
    pids = {p.name: i + 1 for i, p in enumerate(trace.processes)} or {None: 1}
    events: list[dict[str, Any]] = []
    for name, pid in pids.items():
        label = f"corps {h.model} ({h.mode})" + (f" · {name}" if name else "")
        events.append(_meta("process_name", 0, label, pid=pid))
    lanes = Timeline(trace)._lanes()  # same packing as the viewer: row 0 is the agent's track
    now = trace.end_t
    lane_of: dict[int, tuple[int, int]] = {}  # call id -> its lane's (pid, thread id)
    tid = 0
    for name, rows in lanes.items():
        pid = pids.get(rows[0][0].process, 1)
        for r, row in enumerate(rows):
            tid += 1
            label = name if r == 0 else f"{name} ({r + 1})"
            events.append(_meta("thread_name", tid, label, pid=pid))
            events.append(_meta("thread_sort_index", tid, None, pid=pid, sort_index=tid))
            for c in row:
                lane_of[c.id] = (pid, tid)
                events += _call_events(c, tid, now=now, pid=pid)
    events += _flows(trace, lane_of, now)
    if trace.steps:  # the loop's steps on a track of their own, tid 0, per engine
        for pid in pids.values():
            events.append(_meta("thread_name", 0, "engine loop", pid=pid))
    for s, proc in zip(trace.steps, trace.step_processes, strict=True):
        ts, pid = _us(s.t), pids.get(proc, 1)
        events.append(_counter("store tokens", ts, pid, used=s.store_used, capacity=s.capacity))
        events.append(_counter("batch", ts, pid, calls=s.calls, queued=s.queue))
        events.append(_step_slice(s, ts, pid))
    for lk in trace.leaks:
        events.append(
            dict(ph="i", s="g", pid=1, tid=0, ts=_us(lk.t), name="leak", args=dict(lk.model_dump()))
        )
    for e in trace.errors:
        events.append(
            dict(ph="i", s="g", pid=1, tid=0, ts=_us(e.t), name="error", args=dict(e.model_dump()))
        )
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": h.model_dump()}


#: The step event's fields a step slice carries as its args.
STEP_ARGS = {"calls", "stepped", "rows", "sampled", "queue", "admit_s", "evicted", "recomputed"}


def _step_slice(s: Step, ts: float, pid: int) -> dict[str, Any]:
    """One step of the batching loop as a slice: its width, admission and preemption."""
    args = s.model_dump(include=STEP_ARGS)
    return dict(ph="X", pid=pid, tid=0, ts=ts, dur=_us(s.dur), name="step", cat="step", args=args)


def _meta(kind: str, tid: int, name: str | None, pid: int = 1, **args: Any) -> dict[str, Any]:
    if name is not None:
        args["name"] = name
    return dict(ph="M", pid=pid, tid=tid, name=kind, args=args)


def _counter(name: str, ts: float, pid: int, **values: int) -> dict[str, Any]:
    return dict(ph="C", pid=pid, tid=0, ts=ts, name=name, args=values)


def _phases(c: CallRec, now: float) -> list[tuple[str, float, float]]:
    end = c.stop(now)
    admitted = c.admitted if c.admitted is not None else (c.first or end)
    out = [("queue", c.start, admitted)]
    if c.end is None:
        out.append(("pending", admitted, end))
    elif c.first is not None:
        out += [("prefill", admitted, c.first), ("decode", c.first, end)]
    else:
        out.append(("prefill", admitted, end))
    return [(n, a, b) for n, a, b in out if b > a]


def _call_args(c: CallRec) -> dict[str, Any]:
    args: dict[str, Any] = dict(call=c.id, agent=c.agent, kind=c.kind, status=c.status)
    if c.end is not None:
        args.update(c.end.model_dump(exclude={"t", "type", "call", "agent", "kind", "status"}))
    return args


def _call_events(c: CallRec, tid: int, *, now: float, pid: int = 1) -> list[dict[str, Any]]:
    """The call's complete event on its lane, with its phases nested inside."""
    name = f"{c.kind} {c.id}"
    start, end = _us(c.start), _us(c.stop(now))
    out = [dict(ph="X", pid=pid, tid=tid, ts=start, dur=end - start, name=name, cat="call")]
    out[0]["args"] = _call_args(c)
    for phase, a, b in _phases(c, now):
        out.append(
            dict(ph="X", pid=pid, tid=tid, ts=_us(a), dur=_us(b) - _us(a), name=phase, cat="phase")
        )
    return out


def _inside(c: CallRec, now: float, at_end: bool) -> float:
    """A timestamp inside the call's slice: 1 us from its end (a maker) or its start (a
    reader), its middle when it is shorter than 2 us."""
    a, b = _us(c.start), _us(c.stop(now))
    if b - a < 2:
        return (a + b) / 2
    return b - 1 if at_end else a + 1


def _flows(trace: Trace, lane_of: dict[int, tuple[int, int]], now: float) -> list[dict[str, Any]]:
    """Arrows from the call that made a message to each call that read it: a flow start
    inside the maker's slice, a flow end (bound to the enclosing slice) inside the
    reader's, each on the call's own lane."""
    out = []
    n = 0
    for c in trace.calls.values():
        for p in c.queued.parents:
            maker = trace.producer(p)
            if maker is None or maker.end is None or maker.id not in lane_of:
                continue
            n += 1
            common = dict(id=n, name=f"m{p}", cat="message")
            (mpid, mtid), (rpid, rtid) = lane_of[maker.id], lane_of[c.id]
            out.append(dict(ph="s", pid=mpid, tid=mtid, ts=_inside(maker, now, True), **common))
            out.append(
                dict(ph="f", bp="e", pid=rpid, tid=rtid, ts=_inside(c, now, False), **common)
            )
    return out


# ---- SVG / HTML ----


_FONT_FACE = re.compile(r"\s*@font-face\s*\{[^}]*\}")


def svg(console: Console, title: str) -> str:
    """The recorded console as a self-contained SVG: rich's export without its
    `@font-face` rules, which fetch Fira Code from a CDN when the picture is opened
    (the text falls back to a local Fira Code, else the viewer's monospace)."""
    return _FONT_FACE.sub("", console.export_svg(title=title, clear=False))


def record(trace: Trace, width: int = 120, flt: Filter = ALL, limit: int = 40) -> Console:
    """The viewer's overview printed into a recording console (`export_svg`, `export_html`)."""
    console = Console(record=True, width=width, file=io.StringIO(), force_terminal=True)
    for part in overview(trace, flt, limit):
        console.print(part)
    return console
