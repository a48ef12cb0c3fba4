"""Exports (corps.cli.trace_export): Perfetto trace events, OTLP/JSON, SVG and HTML."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from corps.cli import trace_export as tx
from corps.engine.trace_file import Trace

from conftest import TRACE_SETTINGS

PHASES = {"X", "M", "b", "e", "s", "f", "C", "i"}


def check_perfetto(doc: dict) -> None:
    """The Chrome trace event format, as Perfetto and chrome://tracing read it."""
    events = doc["traceEvents"]
    assert isinstance(events, list) and events
    assert {e["pid"] for e in events} == {1}  # one process
    for e in events:
        assert e["ph"] in PHASES and isinstance(e["name"], str)
        if e["ph"] != "M":
            assert isinstance(e["ts"], int | float) and e["ts"] >= 0
        if e["ph"] == "X":
            assert isinstance(e["dur"], int | float) and e["dur"] >= 0
        if e["ph"] in "bef":
            assert "id" in e
    opens = {(e["id"], e["name"]) for e in events if e["ph"] == "b"}
    assert opens == {(e["id"], e["name"]) for e in events if e["ph"] == "e"}
    starts = sorted(e["id"] for e in events if e["ph"] == "s")
    assert starts == sorted(e["id"] for e in events if e["ph"] == "f")
    json.dumps(doc)  # serialisable as is


@pytest.mark.parametrize("key", list(TRACE_SETTINGS))
def test_perfetto_export_is_valid_for_every_pattern(traces, key):
    trace = Trace.load(traces[key])
    doc = tx.perfetto(trace)
    check_perfetto(doc)
    events = doc["traceEvents"]
    threads = {e["args"]["name"]: e["tid"] for e in events if e["name"] == "thread_name"}
    agents = {tx.names_of(trace)(c.agent) for c in trace.calls.values()}
    assert set(threads) == agents  # one lane per agent
    calls = [e for e in events if e.get("cat") == "call" and e["ph"] in "Xb"]
    assert sorted(e["args"]["call"] for e in calls) == sorted(trace.calls)
    assert any(e["ph"] == "C" and e["name"] == "store tokens" for e in events)


def test_overlapping_calls_become_async_slices(traces):
    doc = tx.perfetto(Trace.load(traces["tree_of_thoughts"]))
    asyncs = [e for e in doc["traceEvents"] if e["ph"] == "b"]
    assert asyncs  # 4 proposals of one agent overlap
    flows = [e for e in doc["traceEvents"] if e["ph"] == "s"]
    assert flows  # the voters read the proposals


def test_otlp_spans_follow_the_genai_conventions(traces):
    trace = Trace.load(traces["debate"])
    doc = tx.otlp(trace)
    spans = doc["resourceSpans"][0]["scopeSpans"][0]["spans"]
    ids = {s["spanId"] for s in spans}
    assert len(ids) == len(spans) and all(len(s) == 16 for s in ids)
    assert len({s["traceId"] for s in spans}) == 1 and len(spans[0]["traceId"]) == 32
    roots = [s for s in spans if "parentSpanId" not in s]
    assert len(roots) == 1
    assert all(s["parentSpanId"] in ids for s in spans if s is not roots[0])
    calls = [s for s in spans if s["kind"] == 3]
    assert len(calls) == len(trace.calls)
    for s in spans:
        assert int(s["startTimeUnixNano"]) <= int(s["endTimeUnixNano"])
    decode = next(s for s in calls if s["name"].startswith("chat "))
    attrs = {a["key"]: a["value"] for a in decode["attributes"]}
    for key in (
        tx.GenAI.OPERATION,
        tx.GenAI.MODEL,
        tx.GenAI.AGENT,
        tx.GenAI.INPUT_TOKENS,
        tx.GenAI.OUTPUT_TOKENS,
        tx.GenAI.CACHE_READ,
        tx.GenAI.TTFT,
        tx.Corps.PARENTS,
        tx.Corps.OFFSETS,
    ):
        assert key in attrs
    assert attrs[tx.GenAI.OPERATION] == {"stringValue": "chat"}
    assert "arrayValue" in attrs[tx.Corps.PARENTS]


def test_post_otlp_sends_json_to_a_collector(traces):
    got = []

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            got.append((self.path, self.headers["Content-Type"], json.loads(body)))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Collector)
    thread = threading.Thread(target=server.handle_request)
    thread.start()
    payload = tx.otlp(Trace.load(traces["debate"]))
    status = tx.post_otlp(payload, f"http://127.0.0.1:{server.server_port}/v1/traces")
    thread.join(10)
    server.server_close()
    assert status == 200
    assert got == [("/v1/traces", "application/json", payload)]


def test_svg_and_html(traces):
    console = tx.record(Trace.load(traces["prisoners_dilemma"]), width=100)
    svg = console.export_svg(title="t", clear=False)
    html = console.export_html(clear=False)
    assert svg.startswith("<svg") and "timeline" in svg.replace("&#160;", " ")
    assert "<html>" in html.lower() and "leak" in html
