"""engine/trace/merge.py: several engines' traces as one, one process lane per engine."""

from __future__ import annotations

import pytest

from corps.engine.trace.merge import merge
from corps.engine.trace.reader import Trace
from corps.view import Timeline
from corps.view.export import perfetto

from conftest import open_tiny


async def _traced(tiny_dirs, path, text):
    async with open_tiny(tiny_dirs, "llama", trace=path) as engine:
        q = await engine.prefill(text)
        a = await engine.decode(parents=[q], max_tokens=3, owner="alice")
        await engine.decode(parents=[q, a], max_tokens=2, owner="bob")


async def test_merged_traces_keep_each_engine_apart(tiny_dirs, tmp_path):
    for name, text in (("w1", "first engine"), ("w2", "second engine")):
        await _traced(tiny_dirs, tmp_path / f"{name}.jsonl", text)
    torn = (tmp_path / "w2.jsonl").read_text() + '{"t": 9.0, "type": "qu'  # killed mid-line
    out = tmp_path / "merged.jsonl"
    merge({"worker-1": (tmp_path / "w1.jsonl").read_text(), "worker-2": torn}, out,
          info={"worker-1": {"pid": 11, "host": "h"}})  # fmt: skip
    alone = [Trace.load(tmp_path / f"{n}.jsonl") for n in ("w1", "w2")]
    trace = Trace.load(out)
    assert [p.name for p in trace.processes] == ["worker-1", "worker-2"]
    assert trace.processes[0].pid == 11 and not trace.warnings and trace.closed
    assert len(trace.calls) == sum(len(t.calls) for t in alone)
    assert len(trace.messages) == sum(len(t.messages) for t in alone)  # ids made unique
    for c in trace.calls.values():  # a parent is always its own engine's message
        for p in c.queued.parents:
            assert trace.producer(p) is None or trace.producer(p).process == c.process
    texts = {trace.text(m) for m in trace.messages}
    assert {"first engine", "second engine"} <= {t.strip() for t in texts} | texts
    lanes = list(Timeline(trace)._lanes())
    assert lanes == sorted(lanes, key=lambda n: n.split()[0])  # grouped per worker
    assert {n.split()[0] for n in lanes} == {"w1", "w2"}
    events = perfetto(trace)["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert sorted(names) == [1, 2] and names[2].endswith("worker-2")
    from corps.engine.trace.spans import otlp

    spans = otlp(trace)["resourceSpans"][0]["scopeSpans"][0]["spans"]
    agents = {s["name"] for s in spans if s["name"].startswith("invoke_agent")}
    assert {"invoke_agent w1 (engine)", "invoke_agent w2 (engine)"} <= agents
    flows = [e for e in events if e["ph"] in "sf"]
    assert flows and all(e["pid"] in (1, 2) for e in flows)
    assert {e["pid"] for e in events if e.get("cat") == "call"} == {1, 2}


def test_nothing_to_merge(tmp_path):
    with pytest.raises(ValueError, match="no traces"):
        merge({"w": "not a trace\n"}, tmp_path / "m.jsonl")
