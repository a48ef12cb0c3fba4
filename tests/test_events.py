"""Trace events (trace/events.py): the schema, and what a traced engine and runtime write."""

from __future__ import annotations

import json
import warnings

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from corps.agents import Agent, Runtime
from corps.cache import InvalidRequest, Private
from corps.cache.visibility import LeakWarning
from corps.engine.trace.events import EVENT, EVENT_TYPES, TRACE_FORMAT, Recorder, visibility_name

from conftest import open_tiny


def lines(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def by_type(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["type"] == kind]


# ---- the schema ----

SAMPLES = [
    dict(type="header", model="m", mode="baseline", dtype="float32", device="cpu"),
    dict(type="queued", t=0.1, call=1, agent="a", kind="decode", parents=[0], offsets=[None]),
    dict(type="first_token", t=0.2, call=1),
    dict(type="end", t=0.3, call=1, kind="decode", status="error", error="boom", parents=[0]),
    dict(type="message", id=3, role="user", kind="prefill", parents=[1, 2], offsets=[0, 9]),
    dict(type="text", id=3, text='quotes " and\nnewlines'),
    dict(type="freed", id=3),
    dict(type="step", dur=0.01, calls=2, sampled=2, store_used=9, capacity=99, queue=0),
    dict(type="actor", event="ask", agent="bob", peer="alice", ask=4),
    dict(
        type="leak",
        reader="bob",
        parent=3,
        sources=[1],
        call="decode by bob",
        detail="d",
        policy="warn",
    ),
    dict(type="reencode", message=3, reader="bob", clean=5),
    dict(type="error", where="engine loop", detail="MemoryError()"),
    dict(type="stage", run="debate-1a2b3c4d", name="round 2 of 3 · negative"),
    dict(type="gate", run="debate-1a2b3c4d", waited=0.25),
    dict(type="process", t=0.0, name="worker-1", pid=4242, host="node-a"),
    dict(type="closed", t=9.0),
    dict(
        type="audited",
        call=1,
        shadow=7,
        workflow="debate",
        agent="judge",
        repair="query:0.3",
        positions=8,
        gap=0.031,
        agreement=0.875,
        tokens=212,
    ),
    dict(
        type="repair_switch",
        workflow="debate",
        agent="judge",
        before="none",
        after="first:4",
        gap=0.05,
        why="high",
    ),
    dict(type="token", call=1, token=42),
]


def test_every_event_type_has_a_sample():
    assert {s["type"] for s in SAMPLES} == EVENT_TYPES


@pytest.mark.parametrize("sample", SAMPLES, ids=[s["type"] for s in SAMPLES])
def test_events_round_trip_through_json(sample):
    event = EVENT.validate_python(sample)
    again = EVENT.validate_json(event.model_dump_json())
    assert again == event and again.type == sample["type"]


@given(st.text(), st.floats(min_value=0, max_value=1e6), st.integers(0, 2**31))
def test_text_events_round_trip_any_text(text, t, mid):
    event = EVENT.validate_python(dict(type="text", t=t, id=mid, text=text))
    line = event.model_dump_json()
    assert "\n" not in line  # one event, one line, whatever the text
    assert EVENT.validate_json(line) == event


def test_visibility_names():
    from corps.cache import Public, Shared

    assert visibility_name(None) == "public" and visibility_name(Public()) == "public"
    assert visibility_name(Private()) == "private"
    assert visibility_name(Shared({"b", "a"})) == "shared(a,b)"


def test_recorder_without_sinks_is_off_and_fans_out_with_them():
    rec = Recorder()
    assert not rec.on and not rec.tokens
    got, toks = [], []
    rec.add(got.append)
    rec.add(toks.append, tokens=True)
    rec.token(1, 7)
    assert [e.token for e in toks] == [7] and got == []  # tokens only to sinks that asked
    rec.emit(EVENT.validate_python(dict(type="freed", id=1)))
    assert len(got) == 1 and len(toks) == 2
    rec.remove(toks.append)
    assert rec.on and not rec.tokens


# ---- what an engine writes ----


async def test_a_traced_engine_writes_every_call_message_and_step(tiny_dirs, tmp_path):
    path = tmp_path / "t.jsonl"
    async with open_tiny(tiny_dirs, "llama", trace=path) as engine:
        sys = await engine.prefill("You are terse.", role="system")
        q = await engine.prefill("What is 2+2?", parents=[sys])
        a = await engine.decode(parents=[sys, q], max_tokens=5, temperature=0.0)
        many = await engine.decode_many(
            [dict(parents=[sys, q], max_tokens=3, seed=i, temperature=1.0) for i in range(2)]
        )
        engine.free(many[0])
        size = path.stat().st_size
        assert size > 0 and path.read_text().endswith("\n")  # flushed line by line
    events = lines(path)
    assert events[0]["type"] == "header" and events[0]["format"] == TRACE_FORMAT
    assert events[0]["mode"] == "choreographed" and events[0]["dtype"] == "float32"
    assert events[-1]["type"] == "closed"
    ts = [e["t"] for e in events]
    assert all(t >= 0 for t in ts)
    queued, ends = by_type(events, "queued"), by_type(events, "end")
    assert sorted(e["call"] for e in queued) == sorted(e["call"] for e in ends) == [1, 2, 3, 4, 5]
    assert all(e["status"] == "ok" for e in ends)
    made = {e["id"]: e for e in by_type(events, "message")}
    assert set(made) == {sys.id, q.id, a.id, many[0].id, many[1].id}
    texts = {e["id"]: e["text"] for e in by_type(events, "text")}
    assert texts[a.id] == a.text and texts[q.id] == "What is 2+2?"
    end_a = next(e for e in ends if e["message"] == a.id)
    assert end_a["parents"] == [sys.id, q.id] and end_a["generated"] == len(a.generated)
    assert end_a["encoded"] == a.tokens_encoded and end_a["reused"] == a.tokens_reused
    assert end_a["admitted"] <= end_a["first_token"] <= end_a["t"]
    assert made[q.id]["parents"] == [sys.id] and len(made[q.id]["offsets"]) == 1
    first = {e["call"] for e in by_type(events, "first_token")}
    assert first == {e["call"] for e in ends if e["kind"] == "decode"}
    assert [e["id"] for e in by_type(events, "freed")] == [many[0].id]
    steps = by_type(events, "step")
    assert steps and all(s["capacity"] == 4096 and s["dur"] > 0 for s in steps)


async def test_failed_and_cancelled_calls_close_with_their_status(tiny_dirs, tmp_path):
    path = tmp_path / "t.jsonl"
    async with open_tiny(tiny_dirs, "llama", trace=path) as engine:
        q = await engine.prefill("hello")
        with pytest.raises(InvalidRequest):
            await engine.decode(parents=[q], header=[10**9], frame=False)  # outside the vocab
        with anyio.move_on_after(0.05):
            await engine.decode(parents=[q], max_tokens=4000, ignore_eos=True)
    ends = {e["call"]: e for e in by_type(lines(path), "end")}
    assert ends[2]["status"] == "error" and "vocabulary" in ends[2]["error"]
    assert ends[3]["status"] == "cancelled" and ends[3]["message"] is None


async def test_no_trace_writes_nothing_and_builds_no_events(tiny_dirs, tmp_path, monkeypatch):
    import corps.engine.sched.call_events as tracing

    def boom(*a, **k):
        raise AssertionError("built an event with tracing off")

    monkeypatch.setattr(tracing, "end_events", boom)
    monkeypatch.setattr(tracing, "queued_event", boom)
    async with open_tiny(tiny_dirs, "llama") as engine:
        q = await engine.prefill("hello")
        await engine.decode(parents=[q], max_tokens=2)
    assert list(tmp_path.iterdir()) == []


async def test_live_sinks_get_tokens_in_order(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine:
        got = []
        engine.recorder.add(got.append, tokens=True)
        q = await engine.prefill("hello")
        h = await engine.decode(parents=[q], max_tokens=5, ignore_eos=True)
    toks = [e.token for e in got if e.type == "token"]
    assert toks[: len(h.generated)] == list(h.generated)


# ---- what a runtime writes ----


class Echo(Agent):
    system = "You repeat things."

    async def handle(self, msg):
        if getattr(msg, "fail", False):
            raise ValueError("asked to fail")
        return await self.decode(parents=[self.system_prompt, msg], max_tokens=2)


class Fail(BaseModel):
    fail: bool = True


async def test_actor_events_and_leaks_are_traced(tiny_dirs, tmp_path):
    path = tmp_path / "t.jsonl"
    async with open_tiny(tiny_dirs, "llama", trace=path) as engine, Runtime(engine) as rt:
        await rt.spawn(Echo, "alice")
        await rt.spawn(Echo, "bob")
        q = await engine.prefill("hi")
        secret = await engine.prefill("secret", owner="alice", visibility=Private())
        said = await engine.decode(parents=[secret], owner="alice", max_tokens=2)
        await rt.ask("alice", q)
        with pytest.raises(Exception, match="asked to fail"):
            await rt.ask("bob", Fail())
        await rt.send("bob", Fail())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", LeakWarning)
            await engine.decode(parents=[said], owner="bob", max_tokens=2)
        rt.stop("bob")
        await rt.publish("nobody", q)
    events = lines(path)
    actor = by_type(events, "actor")
    kinds = [(e["event"], e["agent"]) for e in actor]
    assert ("spawn", "alice") in kinds and ("spawn", "bob") in kinds
    asks = [e for e in actor if e["event"] == "ask"]
    replies = [e for e in actor if e["event"] == "reply"]
    assert {e["ask"] for e in asks} == {e["ask"] for e in replies}
    assert any(not e["ok"] and "asked to fail" in e["detail"] for e in replies)
    assert any(e["event"] == "failure" and e["agent"] == "bob" for e in actor)
    assert any(e["event"] == "restart" for e in actor)
    assert any(e["event"] == "stop" and e["agent"] == "bob" for e in actor)
    assert any(e["event"] == "dead_letter" and e["agent"] == "topic nobody" for e in actor)
    leaks = by_type(events, "leak")
    assert len(leaks) == 1 and leaks[0]["reader"] == "bob" and leaks[0]["policy"] == "warn"
    assert leaks[0]["parent"] == said.id and secret.id in leaks[0]["sources"]
    ends = {e["call"]: e for e in by_type(events, "end")}
    assert ends[leaks[0]["call_id"]]["agent"] == "bob"  # the leak names its call
    made = {e["id"]: e for e in by_type(events, "message")}
    assert made[secret.id]["visibility"] == "private" and made[secret.id]["owner"] == "alice"


async def test_a_runtime_can_trace_just_its_own_lifetime(tiny_dirs, tmp_path):
    path = tmp_path / "rt.jsonl"
    async with open_tiny(tiny_dirs, "llama") as engine:
        await engine.prefill("before")  # not traced
        async with Runtime(engine, trace=path) as rt:
            await rt.spawn(Echo, "alice")
            q = await engine.prefill("hi")
            await rt.ask("alice", q)
        await engine.prefill("after")  # not traced either
    events = lines(path)
    assert events[0]["type"] == "header" and events[-1]["type"] == "closed"
    texts = [e["text"] for e in by_type(events, "text")]
    assert "hi" in texts and "before" not in texts and "after" not in texts
    assert [e["event"] for e in by_type(events, "actor")][:2] == ["spawn", "ask"]
