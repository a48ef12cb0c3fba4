"""engine/trace/spans.py: a trace as OTLP/JSON spans under the GenAI conventions."""

from __future__ import annotations

import json

from corps.engine.trace import spans as tx
from corps.engine.trace.reader import Trace


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


def test_exporting_a_trace_twice_gives_the_same_trace_and_span_ids(traces):
    """Ids are derived from the run, so sending it again does not make a second trace."""
    path = traces["debate"]
    first, again = tx.otlp(Trace.load(path)), tx.otlp(Trace.load(path))
    assert first == again


def test_texts_leave_only_when_asked_and_private_ones_only_when_asked_for(traces):
    """Spans carry no text by default; `public` adds public messages' texts, `all`
    private and shared ones too (the players' private system prompts)."""
    trace = Trace.load(traces["prisoners_dilemma"])
    private = [trace.text(m.id) for m in trace.messages.values() if m.visibility != "public"]
    public = [
        trace.text(m.id)
        for m in trace.messages.values()
        if m.visibility == "public" and len(trace.text(m.id)) >= 4
    ]
    assert private and public

    def blob(texts):
        return json.dumps(tx.otlp(trace, texts))

    none, some, every = blob("none"), blob("public"), blob("all")
    assert not any(json.dumps(t)[1:40] in none for t in private + public)
    assert any(json.dumps(t)[1:40] in some for t in public)
    assert not any(json.dumps(t)[1:40] in some for t in private if len(t) > 20)
    assert any(json.dumps(t)[1:40] in every for t in private if len(t) > 20)
    spans = tx.otlp(trace, "all")["resourceSpans"][0]["scopeSpans"][0]["spans"]
    keys = {a["key"] for s in spans for a in s["attributes"]}
    assert {"input.value", "output.value"} <= keys
