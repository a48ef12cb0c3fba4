"""Actor semantics of the in-process runtime (corps.agents)."""

from __future__ import annotations

from typing import Literal

import anyio
import anyio.lowlevel
import pytest
from pydantic import BaseModel, Field

from corps.agents import (
    DEAD_LETTERS,
    Agent,
    AgentError,
    AgentStopped,
    DeadLetter,
    MailboxFull,
    Runtime,
)
from corps.cache import Handle, InvalidRequest, LeakageError, Private

from conftest import open_tiny
from helpers import stepping


class Note(BaseModel):
    n: int = 0
    fail: bool = False


class Recorder(Agent):
    seen: list[int]

    async def handle(self, msg: Note) -> int:
        self.seen = [*getattr(self, "seen", []), msg.n]
        await anyio.lowlevel.checkpoint()
        if msg.fail:
            raise ValueError(f"bad note {msg.n}")
        return msg.n * 2


async def test_ask_fifo_and_errors_come_back(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine, Runtime(engine) as rt:
        await rt.spawn(Recorder, "rec")
        for i in range(10):
            await rt.send("rec", Note(n=i))
        assert await rt.ask("rec", Note(n=10)) == 20
        assert rt.agent("rec").seen == list(range(11))  # one at a time, in order
        with pytest.raises(
            AgentError, match=r"'rec' failed on Note payload: ValueError: bad note 3"
        ) as info:
            await rt.ask("rec", Note(n=3, fail=True))
        assert isinstance(info.value.__cause__, ValueError)
        with pytest.raises(InvalidRequest, match="not str"):
            await rt.ask("rec", "plain text")


async def test_bounded_mailbox(tiny_dirs):
    class Tiny(Recorder):
        mailbox_size = 2

    async with open_tiny(tiny_dirs, "llama") as engine, Runtime(engine) as rt:
        await rt.spawn(Tiny, "tiny")
        rt.send_nowait("tiny", Note(n=1))  # no await between: the worker cannot drain
        rt.send_nowait("tiny", Note(n=2))
        with pytest.raises(MailboxFull, match="mailbox is full"):
            rt.send_nowait("tiny", Note(n=3))
        await rt.send("tiny", Note(n=3))  # waits for room instead
        assert await rt.ask("tiny", Note(n=4)) == 8
        assert rt.agent("tiny").seen == [1, 2, 3, 4]


async def test_max_concurrency_runs_handlers_side_by_side(tiny_dirs):
    both_in = anyio.Event()
    inside = []

    class Pair(Agent):
        max_concurrency = 2

        async def handle(self, msg: Note) -> int:
            inside.append(msg.n)
            if len(inside) == 2:
                both_in.set()
            await both_in.wait()
            return msg.n

    async with open_tiny(tiny_dirs, "llama") as engine, Runtime(engine) as rt:
        await rt.spawn(Pair, "pair")
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(rt.ask, "pair", Note(n=1))
                tg.start_soon(rt.ask, "pair", Note(n=2))


async def test_timeout_cancels_three_nested_asks_and_their_engine_calls(tiny_dirs):
    cancelled = []
    decoding = anyio.Event()

    class Outer(Agent):
        async def handle(self, msg: Handle) -> Handle:
            try:
                return await self.ask("middle", msg)
            except anyio.get_cancelled_exc_class():
                cancelled.append(self.name)
                raise

    class Middle(Outer):
        async def handle(self, msg: Handle) -> Handle:
            try:
                return await self.ask("inner", msg)
            except anyio.get_cancelled_exc_class():
                cancelled.append(self.name)
                raise

    class Inner(Agent):
        async def handle(self, msg: Handle) -> Handle:
            try:
                stream = self.engine.stream(parents=[msg], max_tokens=4000, ignore_eos=True)
                async with stream:
                    async for _ in stream:
                        decoding.set()
                        await anyio.sleep_forever()  # the call runs until the timeout
            except anyio.get_cancelled_exc_class():
                cancelled.append(self.name)
                raise

    async with open_tiny(tiny_dirs, "llama") as engine, Runtime(engine) as rt:
        for cls, name in ((Outer, "outer"), (Middle, "middle"), (Inner, "inner")):
            await rt.spawn(cls, name)
        q = await engine.prefill("hello world")
        messages = engine.stats().messages
        with pytest.raises(TimeoutError):
            await rt.ask("outer", q, timeout=1.0)
        assert decoding.is_set()
        # the ask returns once every handler has ended and the decode is rolled back
        assert sorted(cancelled) == ["inner", "middle", "outer"]
        engine.check()  # idle: nothing left running
        assert engine.stats().messages == messages
        live = sum(m.slots for m in engine.messages())
        assert engine.stats().tokens_used == live


async def test_restart_budget_then_stop_and_dead_letters(tiny_dirs):
    class Fragile(Recorder):
        system = "you are a careful solver"
        max_restarts = 2

    class Morgue(Agent):
        async def handle(self, letter):
            self.letters = [*getattr(self, "letters", []), letter]

    async with open_tiny(tiny_dirs, "llama") as engine, Runtime(engine) as rt:
        await rt.spawn(Morgue, "morgue")
        rt.subscribe(DEAD_LETTERS, "morgue")
        await rt.spawn(Fragile, "fragile")
        system = rt.agent("fragile").system_prompt
        first = rt.agent("fragile")
        await rt.send("fragile", Note(n=1, fail=True))
        assert await rt.ask("fragile", Note(n=2)) == 4  # restarted
        assert rt.agent("fragile") is not first  # fresh state...
        assert rt.agent("fragile").system_prompt == system  # ...same encoded system prompt
        assert rt.agent("fragile").seen == [2]
        await rt.send("fragile", Note(n=3, fail=True))
        await rt.send("fragile", Note(n=4, fail=True))  # over budget: stops
        with anyio.fail_after(10):
            while not rt._actor("fragile").stopped:
                await anyio.sleep(0.01)
        with pytest.raises(AgentStopped):
            await rt.ask("fragile", Note(n=5))
        await rt.send("fragile", Note(n=6))
        await rt.publish("nobody-listens", Note(n=7))
        reasons = [(d.to, d.message.n) for d in rt.dead_letters]
        assert ("fragile", 5) in reasons and ("fragile", 6) in reasons
        assert ("topic nobody-listens", 7) in reasons
        assert len(rt._actor("fragile").failures) == 3
        await rt.ask("morgue", Note(n=0))  # the morgue has handled what was sent before
        letters = [x for x in rt.agent("morgue").letters if isinstance(x, DeadLetter)]
        assert [x.message.n for x in letters] == [5, 6, 7]


async def test_escalate_fails_the_runtime(tiny_dirs):
    class Boss(Recorder):
        supervision = "escalate"

    async with open_tiny(tiny_dirs, "llama") as engine:
        with pytest.raises(AgentError, match="bad note 1"):
            async with Runtime(engine) as rt:
                await rt.spawn(Boss, "boss")
                await rt.send("boss", Note(n=1, fail=True))
                await anyio.sleep_forever()  # cancelled by the escalation


async def test_publish_subscribe(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine, Runtime(engine) as rt:
        await rt.spawn(Recorder, "a")
        await rt.spawn(Recorder, "b")
        rt.subscribe("news", "a")
        rt.subscribe("news", "b")
        await rt.publish("news", Note(n=9))
        assert await rt.ask("a", Note(n=0)) == 0 and await rt.ask("b", Note(n=0)) == 0
        assert rt.agent("a").seen == [9, 0] and rt.agent("b").seen == [9, 0]


async def test_shutdown_with_work_in_flight(tiny_dirs):
    outcome = []

    class Slow(Agent):
        async def handle(self, msg: Handle) -> Handle:
            return await self.decode(parents=[msg], max_tokens=450, ignore_eos=True)

    async with open_tiny(tiny_dirs, "llama") as engine:
        q = await engine.prefill("hello world")
        with anyio.fail_after(30):
            async with anyio.create_task_group() as outer:
                async with Runtime(engine) as rt:
                    await rt.spawn(Slow, "slow")

                    async def asker() -> None:
                        try:
                            await rt.ask("slow", q)
                        except AgentStopped as exc:
                            outcome.append(exc)

                    outer.start_soon(asker)
                    await stepping(engine, 2)  # the decode runs (450 steps): in flight
        assert len(outcome) == 1
        await engine.prefill("x")
        assert engine.stats().running == 0


async def test_ask_stream_through_nested_actors(tiny_dirs):
    class Writer(Agent):
        async def handle(self, msg: Handle) -> Handle:
            return await self.decode(parents=[msg], max_tokens=12, ignore_eos=True)

    class Editor(Agent):
        async def handle(self, msg: Handle) -> Handle:
            self.got = await self.ask("writer", msg, stream=True)
            return self.got

    async with open_tiny(tiny_dirs, "llama") as engine, Runtime(engine) as rt:
        await rt.spawn(Writer, "writer")
        await rt.spawn(Editor, "editor")
        q = await engine.prefill("hello world")
        deltas = [d async for d in rt.ask_stream("editor", q)]
        assert "".join(deltas) == rt.agent("editor").got.text


async def test_nested_streamed_ask_does_not_end_the_outer_stream(tiny_dirs):
    class Writer(Agent):
        async def handle(self, msg: Handle) -> Handle:
            return await self.decode(parents=[msg], max_tokens=6, ignore_eos=True)

    class Editor(Agent):
        async def handle(self, msg: Handle) -> Handle:
            draft = await self.ask("writer", msg, stream=True)
            self.draft = draft
            self.final = await self.decode(parents=[msg, draft], max_tokens=6, ignore_eos=True)
            return self.final

    async with open_tiny(tiny_dirs, "llama") as engine, Runtime(engine) as rt:
        await rt.spawn(Writer, "writer")
        await rt.spawn(Editor, "editor")
        q = await engine.prefill("hello world")
        stream = rt.ask_stream("editor", q)
        text = "".join([d async for d in stream])
        editor = rt.agent("editor")
        assert text == editor.draft.text + editor.final.text  # both decodes streamed
        assert stream.result == editor.final


async def test_leaving_an_ask_stream_early_returns_with_the_store_as_it_was(tiny_dirs):
    class Writer(Agent):
        async def handle(self, msg: Handle) -> Handle:
            return await self.decode(parents=[msg], max_tokens=400, ignore_eos=True)

    async with open_tiny(tiny_dirs, "llama") as engine, Runtime(engine) as rt:
        await rt.spawn(Writer, "writer")
        q = await engine.prefill("hello world")
        before = engine.stats()
        deltas = aiter(rt.ask_stream("writer", q))
        async for _ in deltas:
            break  # the decode is still running
        await deltas.aclose()
        engine.check()  # the handler's decode was rolled back before aclose returned
        after = engine.stats()
        assert (after.messages, after.tokens_used) == (before.messages, before.tokens_used)


async def test_ask_stream_failure_is_an_agent_error(tiny_dirs):
    class Broken(Agent):
        async def handle(self, msg: Handle) -> Handle:
            await self.decode(parents=[msg], max_tokens=2, ignore_eos=True)
            raise ValueError("broken on purpose")

    async with open_tiny(tiny_dirs, "llama") as engine, Runtime(engine) as rt:
        await rt.spawn(Broken, "broken")
        q = await engine.prefill("hello world")
        with pytest.raises(AgentError, match="broken on purpose"):
            async for _ in rt.ask_stream("broken", q):
                pass


async def test_per_call_leak_policy_from_agents(tiny_dirs):
    class Player(Agent):
        async def handle(self, msg: Note) -> Handle:
            public = self.runtime.shared
            if msg.n == 0:
                return await self.prefill("x", parents=[public], leak_policy="deny")
            return await self.decode(parents=[public], max_tokens=2, leak_policy="allow")

    async with open_tiny(tiny_dirs, "llama", leak_policy="deny") as engine, Runtime(engine) as rt:
        secret = await engine.prefill("always defect", owner="alice", visibility=Private())
        rt.shared = await engine.prefill("hello world", parents=[secret], owner="alice")
        await rt.spawn(Player, "bob")
        with pytest.raises(AgentError) as info:
            await rt.ask("bob", Note(n=0))
        assert isinstance(info.value.__cause__, LeakageError)
        assert await rt.ask("bob", Note(n=1))  # "allow" on the call beats the engine's deny
        assert [leak.reader for leak in engine.leaks()] == ["bob"]


async def test_stopping_the_runtime_frees_system_prompts(tiny_dirs):
    class Solver(Agent):
        system = "you are a careful solver"

        async def handle(self, msg: Note) -> int:
            return msg.n

    async with open_tiny(tiny_dirs, "llama") as engine:
        before = engine.stats()
        async with Runtime(engine) as rt:
            await rt.spawn(Solver, "solver")
            assert engine.stats().messages == before.messages + 1
        after = engine.stats()
        assert after.messages == before.messages and after.tokens_used == before.tokens_used


class Verdict(BaseModel):
    decision: Literal["continue", "stop"]
    votes: int = Field(ge=0, le=9)


class Judge(Agent):
    async def handle(self, question: Handle) -> Handle:
        return await self.decode(parents=[question], schema=Verdict, max_tokens=40)


async def test_typed_replies_carry_the_parsed_model(tiny_dirs):
    """`Agent.decode(schema=Model)`: the reply matches the model's schema and the
    handle carries the parsed instance, so agents pass typed payloads."""
    async with open_tiny(tiny_dirs, "llama") as engine, Runtime(engine) as rt:
        await rt.spawn(Judge, "judge")
        q = await engine.prefill("stop or continue?")
        reply = await rt.ask("judge", q)
        assert reply.complete and isinstance(reply.value, Verdict)
        assert reply.value == Verdict.model_validate_json(reply.text)
        plain = await engine.decode(parents=[q], json_schema={"type": "boolean"}, max_tokens=8)
        assert plain.value in (True, False)
        cut = await engine.decode(parents=[q], json_schema=Verdict, max_tokens=2)
        assert not cut.complete and cut.value is None
        free = await engine.decode(parents=[q], max_tokens=3)
        assert free.value is None
        with pytest.raises(InvalidRequest, match="pydantic model class"):
            await rt.agent("judge").decode(parents=[q], schema=dict)


async def test_a_typed_reply_cut_by_its_budget_is_reported_not_silent(tiny_dirs):
    """A schema-constrained reply cut by max_tokens warns, naming the agent, the schema,
    the field it was cut in and the tokens it had; no text of the reply."""
    from corps.agents import IncompleteReply

    class Hasty(Agent):
        async def handle(self, question: Handle) -> Handle:
            return await self.decode(parents=[question], schema=Verdict, max_tokens=6)

    async with open_tiny(tiny_dirs, "llama") as engine, Runtime(engine) as rt:
        await rt.spawn(Hasty, "hasty")
        q = await engine.prefill("stop or continue?")
        with pytest.warns(IncompleteReply) as caught:
            reply = await rt.ask("hasty", q)
        assert reply.value is None and not reply.complete, reply.text
        msg = str(caught[0].message)
        assert "hasty's Verdict reply" in msg and "max_tokens (6 tokens)" in msg
        assert "inside field 'decision'" in msg or "inside field 'votes'" in msg
        assert reply.text not in msg


async def test_an_agent_selects_as_itself(tiny_dirs):
    class Picker(Agent):
        async def handle(self, question: Handle) -> Handle:
            chosen = await self.select(parents=[question], options=["red", "blue"])
            return chosen.handle

    async with open_tiny(tiny_dirs, "llama") as engine, Runtime(engine) as rt:
        await rt.spawn(Picker, "picker")
        q = await engine.prefill("red or blue?")
        h = await rt.ask("picker", q)
        assert h.owner == "picker" and h.text in ("red", "blue")


async def test_ask_many_fans_out_and_raises_the_first_failure_as_itself(tiny_dirs):
    class Echo(Agent):
        async def handle(self, msg: Note) -> int:
            if msg.fail:
                raise ValueError(f"bad note {msg.n}")
            return msg.n

    async with open_tiny(tiny_dirs, "llama") as engine, Runtime(engine) as rt:
        for name in ("a", "b", "c"):
            await rt.spawn(Echo, name)
        got = await rt.ask_many([("a", Note(n=1)), ("b", Note(n=2)), ("c", Note(n=3))])
        assert got == [1, 2, 3]
        asks = [("a", Note(n=4)), ("b", Note(n=5, fail=True)), ("c", Note(n=6, fail=True))]
        with pytest.raises(AgentError, match="bad note 5") as info:
            await rt.ask_many(asks)
        assert info.value.__notes__ == [
            "also failed: AgentError: agent 'c' failed on Note payload: ValueError: bad note 6"
        ]
        assert await rt.ask_many([]) == []


class Configurable(Agent):
    """One class, agents of different settings (`spawn(..., **settings)`)."""

    system = "You are terse."
    max_tokens = 4
    fail_first = False

    async def handle(self, msg: Note):
        if self.fail_first and not getattr(type(self), "_failed", False):
            type(self)._failed = True
            raise RuntimeError("first message fails")
        return self.max_tokens, self.system_prompt.text, type(self).supervision


async def test_spawn_takes_settings_and_restarts_keep_them(tiny_dirs):
    async with open_tiny(tiny_dirs) as engine, Runtime(engine) as rt:
        await rt.spawn(Configurable, "plain")
        await rt.spawn(Configurable, "long", max_tokens=64, system="You are thorough.")
        await rt.spawn(Configurable, "flaky", fail_first=True, max_tokens=9)
        assert await rt.ask("plain", Note()) == (4, "You are terse.", "restart")
        assert await rt.ask("long", Note()) == (64, "You are thorough.", "restart")
        with pytest.raises(AgentError, match="first message fails"):
            await rt.ask("flaky", Note())
        assert (await rt.ask("flaky", Note()))[0] == 9  # the restarted instance kept it
        assert Configurable.max_tokens == 4 and not hasattr(Configurable, "_failed")


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        (dict(max_token=3), r"no setting 'max_token' \(its settings: .*max_tokens"),
        (dict(max_tokens="8"), r"Configurable.max_tokens: Input should be a valid integer"),
        (dict(system=5), r"Configurable.system: Input should be a valid string"),
        (dict(max_concurrency=10**9), r"max_concurrency must be 1 to 1024"),
        (dict(max_concurrency=0), r"max_concurrency must be 1 to 1024"),
        (dict(mailbox_size=-1), r"mailbox_size at least 1"),
        (dict(supervision="sometimes"), r"supervision must be one of"),
        (dict(handle=None), r"no setting 'handle'"),
    ],
)
async def test_bad_settings_are_refused_before_anything_starts(tiny_dirs, settings, match):
    async with open_tiny(tiny_dirs) as engine, Runtime(engine) as rt:
        with pytest.raises(InvalidRequest, match=match):
            await rt.spawn(Configurable, "x", **settings)
        assert engine.stats().messages == 0  # no system prompt was encoded
        await rt.spawn(Configurable, "x")  # the name was not taken
