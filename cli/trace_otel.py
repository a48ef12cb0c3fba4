"""Sending a trace's spans to an OpenTelemetry collector with the OTel SDK's exporters.

`trace_export.otlp(trace)` builds the spans once (OTLP/JSON, GenAI attribute
names); `spans(payload)` turns them into the SDK's `ReadableSpan`s with the same
ids, parents, times, attributes and status, and `send` hands them to the SDK's
OTLP exporter: HTTP with protobuf bodies (what Phoenix, Jaeger, Logfire and
otel-tui all accept; many reject OTLP/JSON with 415) or gRPC. Needs the
optional extra `pip install 'corps[otel]'` (gRPC also
`opentelemetry-exporter-otlp-proto-grpc`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from corps.cache.errors import CorpsError

PROTOCOLS = ("http/protobuf", "grpc")


class OtelUnavailable(CorpsError):
    """The OpenTelemetry SDK or the exporter a protocol needs is not installed."""


class OtelSendFailed(CorpsError):
    """The collector did not take the spans (down, refused, or rejected them)."""


def spans(payload: dict[str, Any]) -> list[Any]:
    """The OTLP/JSON spans of `payload` as the SDK's `ReadableSpan`s."""
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags
    except ImportError as exc:
        raise OtelUnavailable(
            f"sending spans needs the OpenTelemetry SDK: pip install 'corps[otel]' ({exc})"
        ) from None
    out = []
    sampled = TraceFlags(TraceFlags.SAMPLED)
    for rs in payload["resourceSpans"]:
        resource = Resource(_values(rs["resource"]["attributes"]))
        for ss in rs["scopeSpans"]:
            scope = InstrumentationScope(ss["scope"]["name"], ss["scope"].get("version"))
            for s in ss["spans"]:
                trace_id = int(s["traceId"], 16)
                ctx = SpanContext(trace_id, int(s["spanId"], 16), False, sampled)
                parent = s.get("parentSpanId")
                status = s.get("status", {})
                out.append(
                    ReadableSpan(
                        name=s["name"],
                        context=ctx,
                        parent=SpanContext(trace_id, int(parent, 16), False, sampled)
                        if parent
                        else None,
                        resource=resource,
                        attributes=_values(s["attributes"]),
                        kind=SpanKind(s["kind"] - 1),  # OTLP counts from UNSPECIFIED = 0
                        status=Status(StatusCode(status.get("code", 0)), status.get("message")),
                        start_time=int(s["startTimeUnixNano"]),
                        end_time=int(s["endTimeUnixNano"]),
                        instrumentation_scope=scope,
                    )
                )
    return out


def send(payload: dict[str, Any], endpoint: str, *, protocol: str = "http/protobuf") -> int:
    """Export the payload's spans to `endpoint` (e.g. http://localhost:4318/v1/traces,
    or localhost:4317 for gRPC) with the SDK's exporter; returns how many were sent.
    Raises OtelSendFailed if the collector did not take them."""
    if protocol not in PROTOCOLS:
        raise OtelUnavailable(f"protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    batch = spans(payload)
    exporter = _exporter(endpoint, protocol)
    try:
        result = exporter.export(batch)
    finally:
        exporter.shutdown()
    if result.name != "SUCCESS":
        raise OtelSendFailed(
            f"the collector at {endpoint} did not take the {len(batch)} spans ({protocol}); "
            f"is it running, and does it accept OTLP over {protocol}?"
        )
    return len(batch)


def _exporter(endpoint: str, protocol: str):
    try:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            return OTLPSpanExporter(endpoint=endpoint, insecure=endpoint.startswith("http://"))
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        extra = "opentelemetry-exporter-otlp-proto-grpc" if protocol == "grpc" else "corps[otel]"
        raise OtelUnavailable(
            f"OTLP over {protocol} needs: pip install '{extra}' ({exc})"
        ) from None
    return OTLPSpanExporter(endpoint=endpoint, timeout=10)


def _values(attrs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {a["key"]: _value(a["value"]) for a in attrs}


def _value(v: dict[str, Any]) -> Any:
    if "arrayValue" in v:
        return [_value(x) for x in v["arrayValue"].get("values", [])]
    if "intValue" in v:
        return int(v["intValue"])
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in v:
            return v[key]
    raise ValueError(f"unknown OTLP value {v!r}")
