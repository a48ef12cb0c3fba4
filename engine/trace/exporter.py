"""Sending a trace's spans to an OpenTelemetry collector with the OTel SDK's exporters.

`corps.engine.trace.spans.otlp(trace)` builds the spans once (OTLP/JSON, GenAI attribute
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
from corps.engine.trace import spans as tx
from corps.engine.trace.events import Audited, CallEnd, CallQueued

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


def _exporter(endpoint: str, protocol: str, timeout: float = 10.0):
    try:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            # plaintext unless the endpoint says https: `localhost:4317` is how local
            # collectors (Phoenix, otel-tui, the OTel collector) listen; the SDK's
            # default for a bare host:port is TLS, which they reject at the handshake
            insecure = not endpoint.startswith("https://")
            return OTLPSpanExporter(endpoint=endpoint, insecure=insecure, timeout=timeout)
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        extra = "opentelemetry-exporter-otlp-proto-grpc" if protocol == "grpc" else "corps[otel]"
        raise OtelUnavailable(
            f"OTLP over {protocol} needs: pip install '{extra}' ({exc})"
        ) from None
    return OTLPSpanExporter(endpoint=endpoint, timeout=timeout)


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


class LiveSpans:
    """A recorder sink (`engine.recorder.add(sink)`) that sends each call's span as the
    call ends (and each audit's, `corps.audit`, as it is made), under one root span
    for the run, through the SDK's batch processor.

    Spans leave from a background thread, so a slow or failing collector never slows
    or fails the run; spans it did not take are counted in `dropped` (`sent` counts
    the rest). `close()` ends the root span and flushes, waiting at most `flush_s`.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        model: str,
        mode: str,
        started_unix: float,
        protocol: str = "http/protobuf",
        flush_s: float = 5.0,
    ) -> None:
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.trace import set_span_in_context
        except ImportError as exc:
            raise OtelUnavailable(
                f"live export needs the OpenTelemetry SDK: pip install 'corps[otel]' ({exc})"
            ) from None
        self.model, self._t0 = model, started_unix
        # a short timeout: a collector that is down delays only the final flush, briefly
        self._counter = _Counting(_exporter(endpoint, protocol, timeout=2.0))
        self._provider = TracerProvider(resource=Resource({"service.name": "corps"}))
        self._flush_ms = int(flush_s * 1000)
        self._provider.add_span_processor(
            BatchSpanProcessor(self._counter, schedule_delay_millis=500)
        )
        self._tracer = self._provider.get_tracer("corps")
        self._root = self._tracer.start_span(
            f"corps run ({mode})",
            start_time=self._ns(0.0),
            attributes={"corps.mode": mode, "gen_ai.request.model": model},
        )
        self._parent = set_span_in_context(self._root)
        self._queued: dict[int, float] = {}
        self._closed = False

    def _ns(self, t: float) -> int:
        return int((self._t0 + t) * 1e9)

    def __call__(self, event: Any) -> None:
        """Runs on the event loop for every trace event: only a call's end and an audit
        do work."""
        if self._closed:
            return
        if isinstance(event, CallQueued):
            self._queued[event.call] = event.t
        elif isinstance(event, CallEnd):
            from opentelemetry.trace import SpanKind, Status, StatusCode  # loaded by __init__

            start = self._queued.pop(event.call, event.t)
            agent = event.agent or "(engine)"
            attrs, status = tx.call_attributes(event.call, event.kind, agent, self.model, event)
            span = self._tracer.start_span(
                tx.span_name(event.kind, self.model),
                context=self._parent,
                kind=SpanKind.CLIENT,
                start_time=self._ns(start),
                attributes=_values(attrs),
            )
            span.set_status(Status(StatusCode(status["code"]), status.get("message")))
            span.end(end_time=self._ns(event.t))
        elif isinstance(event, Audited):  # after its call's span left: its own span
            span = self._tracer.start_span(
                "corps.audit",
                context=self._parent,
                start_time=self._ns(event.t),
                attributes=_values(tx.audit_attributes(event)),
            )
            span.end(end_time=self._ns(event.t))

    @property
    def sent(self) -> int:
        return self._counter.sent

    @property
    def dropped(self) -> int:
        return self._counter.dropped

    def close(self, t: float) -> None:
        """End the run's root span at trace time `t` and flush what is left."""
        if self._closed:
            return
        self._closed = True
        self._root.end(end_time=self._ns(t))
        self._provider.force_flush(self._flush_ms)
        self._provider.shutdown()


class _Counting:
    """A span exporter that counts what its inner exporter took and did not."""

    def __init__(self, inner) -> None:
        self.inner, self.sent, self.dropped = inner, 0, 0

    def export(self, spans):
        try:
            result = self.inner.export(spans)
        except Exception:  # a broken collector must never reach the run
            self.dropped += len(spans)
            from opentelemetry.sdk.trace.export import SpanExportResult

            return SpanExportResult.FAILURE
        if result.name == "SUCCESS":
            self.sent += len(spans)
        else:
            self.dropped += len(spans)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def check_available(protocol: str = "http/protobuf") -> None:
    """OtelUnavailable now (before a model loads) if the SDK or the protocol's
    exporter is not installed."""
    try:
        import opentelemetry.sdk

        if protocol == "grpc":
            import opentelemetry.exporter.otlp.proto.grpc
        else:
            import opentelemetry.exporter.otlp.proto.http  # noqa: F401
    except ImportError as exc:
        extra = "opentelemetry-exporter-otlp-proto-grpc" if protocol == "grpc" else "corps[otel]"
        raise OtelUnavailable(
            f"sending spans to a collector needs the OpenTelemetry SDK: pip install '{extra}' "
            f"({exc})"
        ) from None
