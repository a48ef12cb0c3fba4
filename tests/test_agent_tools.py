"""Tools for agents (corps.agents.tools, Agent.decode_with_tools): a tool loop in both
modes, a raising tool read by the model as an error, each call in the trace."""

from __future__ import annotations

import json
from typing import Annotated

import pytest
from pydantic import Field

from corps.agents import Agent, Runtime
from corps.agents.tools import Tool, run_call
from corps.cache import Handle, InvalidRequest
from corps.engine.request.tools import Call

from conftest import open_tiny


def add(a: int, b: int = 1) -> int:
    """Add two integers.

    Longer text the model is not shown."""
    return a + b


async def explode(reason: Annotated[str, Field(max_length=6)]) -> str:
    """Always fails."""
    raise ValueError(f"cannot: {reason}")


class Calculator(Agent):
    tools = (add, explode)

    async def handle(self, msg: Handle) -> Handle:
        return await self.decode_with_tools(
            parents=[msg], tool_choice="explode", max_rounds=1, max_tokens=96, temperature=0.0
        )


def test_a_tool_is_described_by_its_signature_and_docstring():
    tool = Tool.of(add)
    assert (tool.name, tool.description) == ("add", "Add two integers.")
    schema = tool.parameters
    assert schema["required"] == ["a"] and schema["properties"]["b"]["default"] == 1
    assert schema["properties"]["a"]["type"] == "integer"
    with pytest.raises(InvalidRequest, match="annotate parameter 'x'"):
        Tool.of(lambda x: x)
    with pytest.raises(InvalidRequest, match="cannot be named"):
        Tool.of(print)
    with pytest.raises(InvalidRequest, match="a tool is a function"):
        Tool.of(42)


async def test_a_call_runs_or_says_what_went_wrong_as_text():
    tools = {t.name: t for t in map(Tool.of, (add, explode))}
    assert await run_call(tools, Call("add", '{"a": 2, "b": 3}', True)) == ("5", True)
    assert await run_call(tools, Call("add", '{"a": 2}', True)) == ("3", True)
    text, ok = await run_call(tools, Call("explode", '{"reason": "no"}', True))
    assert not ok and text == "error: ValueError: cannot: no"
    text, ok = await run_call(tools, Call("add", '{"a": "two"}', True))
    assert not ok and text.startswith("error: add a: Input should be a valid integer")
    text, ok = await run_call(tools, Call("add", "{not json", True))
    assert not ok and text.startswith("error: add")
    assert await run_call(tools, Call("rm", "{}", True)) == ("error: no tool named 'rm'", False)


@pytest.mark.parametrize("mode", ["choreographed", "baseline"])
async def test_a_tool_loop_feeds_a_raising_tool_back_and_the_trace_shows_each_call(tiny_dirs, mode):
    events = []
    async with open_tiny(tiny_dirs, mode=mode) as engine, Runtime(engine) as rt:
        engine.recorder.add(events.append)
        await rt.spawn(Calculator, "calc")
        q = await engine.prefill("Add 2 and 3.", role="user")
        reply = await rt.ask("calc", q)
        # the answer's context: the offer, the question, the forced call, its error
        roles = [p.role for p in reply.parents]
        assert roles[:3] == ["system", "user", "assistant"] and "tool" in roles
        call = reply.parents[2]
        assert json.loads(call.text)["name"] == "explode"  # the grammar made it whole
        errors = [p.text for p in reply.parents if p.role == "tool"]
        assert errors[0].startswith("error: ValueError: cannot:")
        engine.check()
    tools = [e for e in events if getattr(e, "event", None) == "tool"]
    assert tools and tools[0].agent == "calc" and tools[0].detail == "explode: ValueError"
    assert not tools[0].ok


async def test_a_forced_call_of_a_working_tool_feeds_its_result(tiny_dirs):
    class Adder(Agent):
        tools = (add,)

        async def handle(self, msg: Handle) -> Handle:
            return await self.decode_with_tools(
                parents=[msg], tool_choice="required", max_rounds=1, max_tokens=96
            )

    async with open_tiny(tiny_dirs) as engine, Runtime(engine) as rt:
        await rt.spawn(Adder, "adder")
        reply = await rt.ask("adder", await engine.prefill("Add 2 and 3.", role="user"))
        (result,) = [p for p in reply.parents if p.role == "tool"]
        args = json.loads(reply.parents[2].text)["arguments"]
        assert result.text == str(add(**args))
        again = await rt.ask("adder", await engine.prefill("Add 4 and 5.", role="user"))
        assert again.parents[0] == reply.parents[0]  # the tools' guide, encoded once


async def test_bad_tool_settings_are_refused_before_anything_runs(tiny_dirs):
    class Agentish(Agent):
        tools = (add,)

        async def handle(self, msg: Handle):
            return None

    async with open_tiny(tiny_dirs) as engine, Runtime(engine) as rt:
        await rt.spawn(Agentish, "a")
        me = Agentish("a", rt, None)
        q = await engine.prefill("hi", role="user")
        before = engine.stats().messages
        for kw, match in (
            (dict(tool_choice="rm"), "tool_choice must be"),
            (dict(max_rounds=10**6), "max_rounds must be 0 to 32"),
            (dict(schema=None, regex="x"), r"drop \['regex', 'schema'\]"),
        ):
            with pytest.raises(InvalidRequest, match=match):
                await me.decode_with_tools(parents=[q], **kw)
        assert engine.stats().messages == before
        plain = await me.decode_with_tools(parents=[q], tools=[], max_tokens=3)
        assert plain.role == "assistant"  # no tools: a plain decode
