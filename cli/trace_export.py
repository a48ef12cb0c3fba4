"""Exporting a trace to tools people already use: Perfetto, OpenTelemetry, SVG and HTML.

- `perfetto(trace)`: the Chrome trace event format (`{"traceEvents": [...]}`),
  which ui.perfetto.dev and chrome://tracing open: one process, one thread per
  agent and lane (an agent's overlapping calls get lanes of their own, as the
  terminal viewer's sub-rows), a complete event (`ph: "X"`) per call with its
  phases nested inside, flow arrows from the call that made a message to the
  calls that read it, and counter tracks for store occupancy and batch size.
  Perfetto binds a flow event to the slice open at its timestamp on its
  thread, so each arrow starts inside its maker's call and ends inside its
  reader's, each alone on its lane.
- `otlp(trace)`: OpenTelemetry spans as OTLP/JSON (`resourceSpans`), following
  the GenAI semantic conventions; `corps.cli.trace_otel.send` hands them to the
  OpenTelemetry SDK's OTLP exporter (HTTP/protobuf or gRPC) for Phoenix, Jaeger,
  Logfire or otel-tui.
- `record(trace, width)`: the viewer recorded by rich, for `export_svg` / `export_html`.
"""

from __future__ import annotations

import hashlib
import io
import re
from typing import Any

from rich.console import Console

from corps.cli.trace_view import ALL, Filter, Timeline, names_of, overview
from corps.engine.trace import CallEnd
from corps.engine.trace_file import CallRec, Trace


class GenAI:
    """OpenTelemetry GenAI attribute names (kept here: the semconv package marks them
    experimental and may rename them)."""

    OPERATION = "gen_ai.operation.name"
    MODEL = "gen_ai.request.model"
    AGENT = "gen_ai.agent.name"
    INPUT_TOKENS = "gen_ai.usage.input_tokens"
    OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
    CACHE_READ = "gen_ai.usage.cache_read.input_tokens"
    TTFT = "gen_ai.response.time_to_first_chunk"
    SYSTEM = "gen_ai.provider.name"


class Corps:
    """corps' own span attributes."""

    CALL = "corps.call.id"
    KIND = "corps.call.kind"
    PARENTS = "corps.parents"
    OFFSETS = "corps.offsets"
    NEW_OFFSET = "corps.new_offset"
    ENCODED = "corps.tokens.encoded"
    REUSED = "corps.tokens.reused"
    MESSAGE = "corps.message.id"
    MODE = "corps.mode"


def _us(t: float) -> float:
    return round(t * 1e6, 3)


# ---- Perfetto / Chrome trace events ----


def perfetto(trace: Trace) -> dict[str, Any]:
    h = trace.header
    events: list[dict[str, Any]] = [
        _meta("process_name", 0, f"corps {h.model} ({h.mode})"),
    ]
    lanes = Timeline(trace)._lanes()  # same packing as the viewer: row 0 is the agent's track
    now = trace.end_t
    lane_of: dict[int, int] = {}  # call id -> its lane's thread id
    tid = 0
    for name, rows in lanes.items():
        for r, row in enumerate(rows):
            tid += 1
            events.append(_meta("thread_name", tid, name if r == 0 else f"{name} ({r + 1})"))
            events.append(_meta("thread_sort_index", tid, None, sort_index=tid))
            for c in row:
                lane_of[c.id] = tid
                events += _call_events(c, tid, now=now)
    events += _flows(trace, lane_of, now)
    for s in trace.steps:
        ts = _us(s.t)
        events.append(_counter("store tokens", ts, used=s.store_used, capacity=s.capacity))
        events.append(_counter("batch", ts, calls=s.calls, queued=s.queue))
    for lk in trace.leaks:
        events.append(
            dict(ph="i", s="g", pid=1, tid=0, ts=_us(lk.t), name="leak", args=dict(lk.model_dump()))
        )
    for e in trace.errors:
        events.append(
            dict(ph="i", s="g", pid=1, tid=0, ts=_us(e.t), name="error", args=dict(e.model_dump()))
        )
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": h.model_dump()}


def _meta(kind: str, tid: int, name: str | None, **args: Any) -> dict[str, Any]:
    if name is not None:
        args["name"] = name
    return dict(ph="M", pid=1, tid=tid, name=kind, args=args)


def _counter(name: str, ts: float, **values: int) -> dict[str, Any]:
    return dict(ph="C", pid=1, tid=0, ts=ts, name=name, args=values)


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


def _call_events(c: CallRec, tid: int, *, now: float) -> list[dict[str, Any]]:
    """The call's complete event on its lane, with its phases nested inside."""
    name = f"{c.kind} {c.id}"
    start, end = _us(c.start), _us(c.stop(now))
    out = [dict(ph="X", pid=1, tid=tid, ts=start, dur=end - start, name=name, cat="call")]
    out[0]["args"] = _call_args(c)
    for phase, a, b in _phases(c, now):
        out.append(
            dict(ph="X", pid=1, tid=tid, ts=_us(a), dur=_us(b) - _us(a), name=phase, cat="phase")
        )
    return out


def _inside(c: CallRec, now: float, at_end: bool) -> float:
    """A timestamp inside the call's slice: 1 us from its end (a maker) or its start (a
    reader), its middle when it is shorter than 2 us."""
    a, b = _us(c.start), _us(c.stop(now))
    if b - a < 2:
        return (a + b) / 2
    return b - 1 if at_end else a + 1


def _flows(trace: Trace, lane_of: dict[int, int], now: float) -> list[dict[str, Any]]:
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
            common = dict(id=n, pid=1, name=f"m{p}", cat="message")
            out.append(dict(ph="s", tid=lane_of[maker.id], ts=_inside(maker, now, True), **common))
            out.append(dict(ph="f", bp="e", tid=lane_of[c.id], ts=_inside(c, now, False), **common))
    return out


# ---- OpenTelemetry (OTLP/JSON) ----


def _hex(seed: str, n: int) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()[:n]


def _attr(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        v: dict[str, Any] = {"boolValue": value}
    elif isinstance(value, int):
        v = {"intValue": str(value)}
    elif isinstance(value, float):
        v = {"doubleValue": value}
    elif isinstance(value, list):
        v = {"arrayValue": {"values": [_attr("", x)["value"] for x in value]}}
    else:
        v = {"stringValue": str(value)}
    return {"key": key, "value": v}


def otlp(trace: Trace) -> dict[str, Any]:
    """One trace: a root span for the run, one `invoke_agent` span per agent, one span
    per call under its agent (GenAI attributes plus `corps.*`)."""
    h, names, now = trace.header, names_of(trace), trace.end_t
    trace_id = _hex(f"{trace.path}:{h.started_unix}", 32)

    def nanos(t: float) -> str:
        return str(int((h.started_unix + t) * 1e9))

    calls = sorted(trace.calls.values(), key=lambda c: c.start)
    root = _hex(f"{trace_id}:root", 16)
    t_end = max((c.stop(now) for c in calls), default=0.0)
    spans = [
        _span(
            trace_id,
            root,
            None,
            f"corps run ({h.mode})",
            0.0,
            t_end,
            nanos,
            1,
            [_attr(Corps.MODE, h.mode), _attr(GenAI.MODEL, h.model)],
        )
    ]
    by_agent: dict[str, list[CallRec]] = {}
    for c in calls:
        by_agent.setdefault(names(c.agent), []).append(c)
    for agent, cs in by_agent.items():
        sid = _hex(f"{trace_id}:agent:{agent}", 16)
        a0, a1 = min(c.start for c in cs), max(c.stop(now) for c in cs)
        attrs = [_attr(GenAI.OPERATION, "invoke_agent"), _attr(GenAI.AGENT, agent)]
        spans.append(_span(trace_id, sid, root, f"invoke_agent {agent}", a0, a1, nanos, 1, attrs))
        for c in cs:
            spans.append(_call_span(trace_id, sid, c, agent, h.model, nanos, now))
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [_attr("service.name", "corps")]},
                "scopeSpans": [{"scope": {"name": "corps", "version": h.corps}, "spans": spans}],
            }
        ]
    }


def _span(trace_id, sid, parent, name, a, b, nanos, kind, attrs, status=None) -> dict[str, Any]:
    span = dict(
        traceId=trace_id,
        spanId=sid,
        name=name,
        kind=kind,
        startTimeUnixNano=nanos(a),
        endTimeUnixNano=nanos(b),
        attributes=attrs,
        status=status or {"code": 1},
    )
    if parent is not None:
        span["parentSpanId"] = parent
    return span


def call_attributes(
    call: int, kind: str, agent: str, model: str, end: CallEnd | None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A call's span attributes (OTLP/JSON, GenAI conventions) and status."""
    attrs = [
        _attr(GenAI.OPERATION, _operation(kind)),
        _attr(GenAI.MODEL, model),
        _attr(GenAI.AGENT, agent),
        _attr(GenAI.SYSTEM, "corps"),
        _attr(Corps.CALL, call),
        _attr(Corps.KIND, kind),
    ]
    status: dict[str, Any] = {"code": 1}
    e = end
    if e is not None:
        prompt = e.reused + e.encoded - e.generated
        attrs += [
            _attr(GenAI.INPUT_TOKENS, prompt),
            _attr(GenAI.OUTPUT_TOKENS, e.generated),
            _attr(GenAI.CACHE_READ, e.reused),
            _attr(Corps.PARENTS, list(e.parents)),
            _attr(Corps.OFFSETS, list(e.offsets)),
            _attr(Corps.ENCODED, e.encoded),
            _attr(Corps.REUSED, e.reused),
        ]
        if e.new_offset is not None:
            attrs.append(_attr(Corps.NEW_OFFSET, e.new_offset))
        if e.ttft_s is not None:
            attrs.append(_attr(GenAI.TTFT, float(e.ttft_s)))
        if e.message is not None:
            attrs.append(_attr(Corps.MESSAGE, e.message))
        if e.status != "ok":
            status = {"code": 2, "message": e.error or e.status}
    else:
        status = {"code": 0, "message": "pending when the trace ended"}
    return attrs, status


def _operation(kind: str) -> str:
    """The GenAI operation of a call: a decode is a chat turn; a prefill is ours."""
    return "chat" if kind == "decode" else "corps.prefill"


def span_name(kind: str, model: str) -> str:
    return f"{_operation(kind)} {model}"


def _call_span(trace_id, parent, c: CallRec, agent, model, nanos, now) -> dict[str, Any]:
    attrs, status = call_attributes(c.id, c.kind, agent, model, c.end)
    sid = _hex(f"{trace_id}:call:{c.id}", 16)
    name = span_name(c.kind, model)
    return _span(trace_id, sid, parent, name, c.start, c.stop(now), nanos, 3, attrs, status)


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
