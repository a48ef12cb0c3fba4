"""A trace as OpenTelemetry spans (OTLP/JSON), following the GenAI semantic conventions.

`otlp(trace)` builds one trace from a trace file: a root span for the run, one
`invoke_agent` span per agent, one span per call under its agent (and an audited
call's `corps.audit` span under it), with GenAI attributes (`gen_ai.*`) and
corps' own (`corps.*`). Ids are derived from the
run, so building it twice gives the same trace. `call_attributes` is shared with
the live export (`corps.engine.trace.exporter.LiveSpans`), which sends the same spans as
calls end. Message texts are never part of a span.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

from corps.engine.trace.events import Audited, CallEnd
from corps.engine.trace.reader import CallRec, Trace, names_of


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
    REPAIRED = "corps.tokens.repaired"  # rewired context tokens recomputed (in ENCODED)
    REPAIR = "corps.repair"
    MESSAGE = "corps.message.id"
    MODE = "corps.mode"
    # an audit (corps.engine.audit): its own span, under the audited call's
    AUDIT_GAP = "corps.audit.gap"  # mean KL(baseline || choreographed), nats per token
    AUDIT_AGREEMENT = "corps.audit.agreement"
    AUDIT_POSITIONS = "corps.audit.positions"
    AUDIT_TOKENS = "corps.audit.tokens"  # what its shadow encoded
    AUDIT_SHADOW = "corps.audit.shadow"  # the shadow's call id
    WORKFLOW = "corps.workflow"


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


Texts = Literal["none", "public", "all"]


def otlp(trace: Trace, texts: Texts = "none") -> dict[str, Any]:
    """One trace: a root span for the run, one `invoke_agent` span per agent, one span
    per call under its agent (GenAI attributes plus `corps.*`).

    `texts`: whether call spans carry message texts (`input.value`: the parents the
    call read; `output.value`: what it made; the attributes Phoenix displays):
    "none" (the default: nothing a message says leaves), "public" (public messages'
    texts only) or "all" (private and shared ones too)."""
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
    for c in calls:  # a merged trace: each worker's agents apart (`w2 alice`)
        by_agent.setdefault(names.lane(c), []).append(c)
    for agent, cs in by_agent.items():
        sid = _hex(f"{trace_id}:agent:{agent}", 16)
        a0, a1 = min(c.start for c in cs), max(c.stop(now) for c in cs)
        attrs = [_attr(GenAI.OPERATION, "invoke_agent"), _attr(GenAI.AGENT, agent)]
        spans.append(_span(trace_id, sid, root, f"invoke_agent {agent}", a0, a1, nanos, 1, attrs))
        for c in cs:
            span = _call_span(trace_id, sid, c, agent, h.model, nanos, now)
            if texts != "none" and c.end is not None:
                span["attributes"] += _texts(trace, c, texts)
            spans.append(span)
            a = trace.audits.get(c.id)
            if a is not None:  # its audit, under it: from the call's end to the audit's
                audit = _hex(f"{trace_id}:audit:{c.id}", 16)
                t0 = min(c.stop(now), a.t)
                attrs = audit_attributes(a)
                spans.append(_span(trace_id, audit, span["spanId"], "corps.audit", t0, a.t,
                                   nanos, 1, attrs))  # fmt: skip
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
        if e.repair:  # repaired 0: it read a context another call repaired
            attrs += [_attr(Corps.REPAIRED, e.repaired), _attr(Corps.REPAIR, e.repair)]
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


def audit_attributes(a: Audited) -> list[dict[str, Any]]:
    """An audit's span attributes: the audited call, its key and its figures."""
    return [
        _attr(GenAI.OPERATION, "corps.audit"),
        _attr(Corps.CALL, a.call),
        _attr(Corps.AUDIT_SHADOW, a.shadow),
        _attr(Corps.WORKFLOW, a.workflow),
        _attr(GenAI.AGENT, a.agent),
        _attr(Corps.REPAIR, a.repair),
        _attr(Corps.AUDIT_POSITIONS, a.positions),
        _attr(Corps.AUDIT_GAP, float(a.gap)),
        _attr(Corps.AUDIT_AGREEMENT, float(a.agreement)),
        _attr(Corps.AUDIT_TOKENS, a.tokens),
    ]


def _operation(kind: str) -> str:
    """The GenAI operation of a call: a decode is a chat turn; a prefill is ours."""
    return "chat" if kind == "decode" else "corps.prefill"


def span_name(kind: str, model: str) -> str:
    return f"{_operation(kind)} {model}"


def _texts(trace: Trace, c: CallRec, texts: Texts) -> list[dict[str, Any]]:
    """A call's input (the parents it read, in place order) and output texts, each
    only if `texts` lets its visibility out."""

    def shown(mid: int) -> str | None:
        msg = trace.messages.get(mid)
        if msg is None or (texts == "public" and msg.visibility != "public"):
            return None
        return f"[{msg.role}] {trace.text(mid)}"

    e = c.end
    read = [t for p in e.parents if (t := shown(p)) is not None]
    out = [_attr("input.value", "\n\n".join(read))] if read else []
    made = shown(e.message) if e.message is not None else None
    if made is not None:
        out.append(_attr("output.value", made.split("] ", 1)[1]))
    return out


def _call_span(trace_id, parent, c: CallRec, agent, model, nanos, now) -> dict[str, Any]:
    attrs, status = call_attributes(c.id, c.kind, agent, model, c.end)
    sid = _hex(f"{trace_id}:call:{c.id}", 16)
    name = span_name(c.kind, model)
    return _span(trace_id, sid, parent, name, c.start, c.stop(now), nanos, 3, attrs, status)
