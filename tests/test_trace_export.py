"""Exports (corps.view.export): Perfetto trace events, OTLP/JSON, SVG and HTML."""

from __future__ import annotations

import itertools
import json

import pytest

from corps.engine.trace.reader import Trace, names_of
from corps.engine.trace.spans import otlp
from corps.view import export as tx

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
    agents = {names_of(trace)(c.agent) for c in trace.calls.values()}
    assert threads.pop("engine loop") == 0  # the loop's steps have a track of their own
    assert {name.split(" (")[0] for name in threads} == agents  # lanes of each agent
    calls = [e for e in events if e.get("cat") == "call" and e["ph"] in "Xb"]
    assert sorted(e["args"]["call"] for e in calls) == sorted(trace.calls)
    assert any(e["ph"] == "C" and e["name"] == "store tokens" for e in events)
    steps = [e for e in events if e.get("cat") == "step"]
    assert len(steps) == len(trace.steps) > 0
    for e, st in zip(steps, trace.steps, strict=True):
        assert (e["ph"], e["tid"], e["ts"], e["dur"]) == ("X", 0, tx._us(st.t), tx._us(st.dur))
        assert e["args"]["rows"] == st.rows and e["args"]["stepped"] == st.stepped


def _enclosing_call(events: list[dict], tid: int, ts: float) -> int:
    """The call whose complete event on thread `tid` encloses `ts` (exactly one)."""
    found = [
        e["args"]["call"]
        for e in events
        if e["ph"] == "X" and e.get("cat") == "call" and e["tid"] == tid
        if e["ts"] <= ts <= e["ts"] + e["dur"]
    ]
    assert len(found) == 1, (tid, ts, found)
    return found[0]


@pytest.mark.parametrize("key", list(TRACE_SETTINGS))
def test_every_flow_starts_on_its_maker_and_ends_on_its_reader(traces, key):
    """Perfetto binds a flow event to the slice open at its timestamp on its thread:
    each arrow must start inside the call that made the message and end inside the
    call that read it (overlapping calls of an agent get lanes of their own)."""
    trace = Trace.load(traces[key])
    events = tx.perfetto(trace)["traceEvents"]
    for tid in {e["tid"] for e in events if e["ph"] == "X"}:  # a lane's calls never overlap
        spans = sorted(
            (e["ts"], e["ts"] + e["dur"])
            for e in events
            if e["ph"] == "X" and e.get("cat") == "call" and e["tid"] == tid
        )
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert starts and set(starts) == set(ends)
    for n, s in starts.items():
        message = int(s["name"].removeprefix("m"))
        maker = _enclosing_call(events, s["tid"], s["ts"])
        reader = _enclosing_call(events, ends[n]["tid"], ends[n]["ts"])
        assert maker == trace.producer(message).id
        assert message in trace.calls[reader].queued.parents
    expected = sum(
        1
        for c in trace.calls.values()
        for p in c.queued.parents
        if (m := trace.producer(p)) is not None and m.end is not None
    )
    assert len(starts) == expected  # every read of a made message has its arrow


def test_svg_and_html(traces):
    console = tx.record(Trace.load(traces["prisoners_dilemma"]), width=100)
    svg = tx.svg(console, "t")
    assert "@font-face" not in svg and "url(http" not in svg  # nothing fetched when opened
    assert "Fira Code" in svg  # a local font, else monospace
    html = console.export_html(clear=False)
    assert svg.startswith("<svg") and "timeline" in svg.replace("&#160;", " ")
    assert "<html>" in html.lower() and "leak" in html


def test_no_message_text_and_no_private_text_leaves_in_network_exports(traces):
    """OTLP spans (what goes over the network) and Perfetto events carry ids, counts
    and timings, never a message's text: a private system prompt stays home."""
    trace = Trace.load(traces["prisoners_dilemma"])
    private = [
        trace.text(m.id)
        for m in trace.messages.values()
        if m.visibility != "public" and trace.text(m.id)
    ]
    assert private  # the pattern's players have private system prompts
    for blob in (json.dumps(otlp(trace)), json.dumps(tx.perfetto(trace))):
        assert not any(text[:40] in blob for text in private)
