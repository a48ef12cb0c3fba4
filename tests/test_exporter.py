"""trace/exporter.py: spans sent with the OpenTelemetry SDK, after a run and while it runs."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import ClassVar

import pytest

from corps.engine.trace import spans as tx
from corps.engine.trace.reader import Trace

from conftest import TRACE_SETTINGS, open_tiny


class ProtobufOnly(BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver that, like Phoenix, takes protobuf only (415 otherwise)
    and decodes each request with opentelemetry-proto."""

    got: ClassVar[list] = []

    def do_POST(self):
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers["Content-Type"] != "application/x-protobuf":
            self.send_response(415)
            self.end_headers()
            return
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        self.got.append((self.path, request))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def _receiver():
    ProtobufOnly.got = []
    server = HTTPServer(("127.0.0.1", 0), ProtobufOnly)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _spans():
    return [
        span
        for _, req in ProtobufOnly.got
        for rs in req.resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
    ]


def _closed_port() -> int:
    """A loopback port nothing listens on."""
    server = HTTPServer(("127.0.0.1", 0), ProtobufOnly)
    port = server.server_port
    server.server_close()
    return port


@pytest.mark.parametrize("key", list(TRACE_SETTINGS))
def test_spans_reach_a_protobuf_only_collector_whole(traces, key):
    """Every call of every pattern arrives as a span, its parent resolves, and the
    GenAI attributes are there, through the OpenTelemetry SDK's exporter."""
    pytest.importorskip("opentelemetry.sdk")
    from corps.engine.trace import exporter as otel

    server = _receiver()
    try:
        trace = Trace.load(traces[key])
        payload = tx.otlp(trace)
        url = f"http://127.0.0.1:{server.server_port}/v1/traces"
        n = otel.send(payload, url)
    finally:
        server.shutdown()
        server.server_close()
    spans = _spans()
    assert ProtobufOnly.got[0][0] == "/v1/traces" and n == len(spans)
    ids = {span.span_id for span in spans}
    assert all(not span.parent_span_id or span.parent_span_id in ids for span in spans)
    calls = [s for s in spans if any(a.key == tx.Corps.CALL for a in s.attributes)]
    assert sorted(
        next(a.value.int_value for a in s.attributes if a.key == tx.Corps.CALL) for s in calls
    ) == sorted(trace.calls)
    for s in calls:
        keys = {a.key for a in s.attributes}
        assert {"gen_ai.operation.name", "gen_ai.request.model", "gen_ai.agent.name"} <= keys
    assert len({span.trace_id for span in spans}) == 1


def test_a_collector_that_is_down_fails_the_export_in_one_line(traces, tmp_path):
    pytest.importorskip("opentelemetry.sdk")
    from typer.testing import CliRunner

    from corps.cli.app import app

    port = _closed_port()
    result = CliRunner().invoke(
        app,
        ["trace", "export", str(traces["debate"]), "--otel-endpoint", f"http://127.0.0.1:{port}"],
    )
    assert result.exit_code == 1 and "did not take" in result.output
    assert "Traceback" not in result.output


def test_a_run_sends_each_calls_span_as_it_ends(tiny_dirs):
    pytest.importorskip("opentelemetry.sdk")
    from typer.testing import CliRunner

    from corps.cli.app import app

    server = _receiver()
    url = f"http://127.0.0.1:{server.server_port}/v1/traces"
    try:
        result = CliRunner().invoke(
            app,
            [
                "run", "multi-qa", "--set", "max_tokens=4", "--model", str(tiny_dirs["llama"]),
                "--no-live", "--otel-endpoint", url,
            ],
        )  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()
    assert result.exit_code == 0, result.output
    spans = _spans()
    roots = [s for s in spans if not s.parent_span_id]
    calls = [s for s in spans if s.parent_span_id]
    assert len(roots) == 1 and calls
    assert all(s.parent_span_id == roots[0].span_id for s in calls)
    assert all(s.trace_id == roots[0].trace_id for s in calls)
    assert f"otel: sent {len(spans)} spans" in result.output


def test_a_collector_that_is_down_never_fails_the_run(tiny_dirs):
    pytest.importorskip("opentelemetry.sdk")
    from typer.testing import CliRunner

    from corps.cli.app import app

    port = _closed_port()
    result = CliRunner().invoke(
        app,
        [
            "run", "multi-qa", "--set", "max_tokens=4", "--model", str(tiny_dirs["llama"]),
            "--no-live", "--otel-endpoint", f"http://127.0.0.1:{port}/v1/traces",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "answer" in result.output.lower() and "not taken" in result.output


async def test_engine_open_with_otel_sends_every_call_and_counts_it(tiny_dirs):
    """`Engine.open(otel=URL)`: each call's span under one root, counted in stats."""
    pytest.importorskip("opentelemetry.sdk")
    server = _receiver()
    url = f"http://127.0.0.1:{server.server_port}/v1/traces"
    try:
        async with open_tiny(tiny_dirs, "llama", otel=url) as engine:
            q = await engine.prefill("What is 7*6?", role="user")
            await engine.decode(parents=[q], max_tokens=3, temperature=0.0)
            assert engine.stats().spans_dropped == 0
    finally:
        server.shutdown()
        server.server_close()
    spans = _spans()
    assert engine.otel is not None and engine.otel.sent == len(spans)  # calls + the root
    assert engine.otel.dropped == 0
    assert sorted(s.name.split()[0] for s in spans if s.parent_span_id) == ["chat", "corps.prefill"]


async def test_an_audit_reaches_the_collector_as_its_own_span(tiny_dirs, tmp_path):
    """Live: the audit's span (its figures, the audited call's id, no text) after the
    call's; from the trace file: the same attributes, under the call's span."""
    pytest.importorskip("opentelemetry.sdk")
    server = _receiver()
    url = f"http://127.0.0.1:{server.server_port}/v1/traces"
    path = tmp_path / "t.jsonl"
    try:
        async with open_tiny(
            tiny_dirs, "llama", otel=url, audit=1, audit_budget=1.0, trace=path
        ) as engine:
            q = await engine.prefill("What is 7*6?", role="user")
            d = await engine.decode(parents=[q], max_tokens=3, temperature=0.0, owner="solver")
            await engine.fidelity_report()
    finally:
        server.shutdown()
        server.server_close()
    (audit,) = [s for s in _spans() if s.name == "corps.audit"]
    attrs = {a.key: a.value for a in audit.attributes}
    assert attrs["gen_ai.agent.name"].string_value == "solver"
    assert attrs["corps.audit.positions"].int_value == 3
    assert attrs["corps.audit.gap"].double_value == pytest.approx(0.0, abs=1e-5)  # a chain
    assert d.text not in str(audit) and "7*6" not in str(audit)
    spans = tx.otlp(Trace.load(path))["resourceSpans"][0]["scopeSpans"][0]["spans"]
    (filed,) = [s for s in spans if s["name"] == "corps.audit"]
    (call,) = [s for s in spans if s["spanId"] == filed["parentSpanId"]]
    call_id = [a for a in call["attributes"] if a["key"] == "corps.call.id"]
    assert call["name"].startswith("chat") and call_id[0] in filed["attributes"]


async def test_engine_with_a_collector_that_is_down_runs_and_counts_the_drops(tiny_dirs):
    pytest.importorskip("opentelemetry.sdk")
    url = f"http://127.0.0.1:{_closed_port()}/v1/traces"
    async with open_tiny(tiny_dirs, "llama", otel=url) as engine:
        q = await engine.prefill("What is 7*6?", role="user")
        h = await engine.decode(parents=[q], max_tokens=3, temperature=0.0)
    assert h.length > 0 and engine.otel.sent == 0 and engine.otel.dropped >= 2


def test_a_bad_otel_endpoint_is_refused_before_anything_loads():
    from corps.engine.config import BadConfig, EngineConfig

    with pytest.raises(BadConfig) as info:
        EngineConfig.of(otel="localhost:4318")
    assert info.value.fields == ("otel",) and "--otel-endpoint" in info.value.for_cli()
    assert EngineConfig.of(otel="localhost:4317", otel_protocol="grpc").otel == "localhost:4317"
