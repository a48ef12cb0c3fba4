"""examples/serve_agents_sdk.py and examples/serve_pydantic_ai.py: two agent frameworks,
unchanged, streaming tool-calling turns from `corps serve` (a tiny model, float32):
each assembles a tool call from the streamed tool-call deltas and runs the tool. Then
each framework's typed agent with a tool (a schema beside tools in one request),
streamed and not: it ends with an answer of its output type."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Annotated, Literal

import pytest
from pydantic import BaseModel, Field

pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from corps.engine.api.engine import Engine
from corps.serve.background import BackgroundServer

EXAMPLES = Path(__file__).parent.parent / "examples"


def example(name: str):
    spec = importlib.util.spec_from_file_location(f"examples_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def served(tiny_dirs):
    opened = Engine.open(str(tiny_dirs["llama"]), dtype="float32", capacity=8192)
    with BackgroundServer(opened, model="tiny") as s:
        yield s


async def test_an_openai_agents_sdk_agent_runs_a_tool_from_a_streamed_call(served):
    pytest.importorskip("agents")
    calls = served.app.state.metrics.completions
    out = await example("serve_agents_sdk").run(served.url + "/v1", "tiny", max_tokens=400)
    assert len(out["called"]) == 1  # the SDK assembled the streamed call and ran the tool
    assert out["output"] == f"It is sunny in {out['called'][0]}."
    assert "raw_response_event" in out["events"] and "run_item_stream_event" in out["events"]
    assert served.app.state.metrics.completions == calls + 1  # one streamed turn


async def test_a_pydantic_ai_agent_runs_a_tool_from_a_streamed_call(served):
    pytest.importorskip("pydantic_ai")
    out = await example("serve_pydantic_ai").run(served.url + "/v1", "tiny", max_tokens=400)
    assert len(out["called"]) == 1  # first step: the streamed call, run
    assert out["pieces"] and "".join(out["pieces"]) == out["output"]  # then text, streamed


# ---- typed agents with tools: a schema beside tools in one request ----


class Verdict(BaseModel):
    verdict: Literal["yes", "no"]
    score: int = Field(ge=0, le=9)


def weather_tool(called: list[str]):
    def get_weather(city: Annotated[str, Field(max_length=24)]) -> str:
        """The weather in a city."""
        called.append(city)
        return f"It is sunny in {city}."

    return get_weather


@pytest.mark.parametrize("stream", [False, True])
async def test_an_agents_sdk_agent_with_output_type_and_tools_ends_typed(served, stream):
    """`Agent(output_type=..., tools=[...])`, the SDK's typed-agent pattern, unchanged:
    the model (greedy, tiny) calls the tool, then answers; the answer parses as the
    output type. Before, the server dropped the schema beside tools and the SDK failed
    with "Invalid JSON when parsing model output"; its first reply's last call, cut at
    `max_tokens`, also goes back in the history (it was refused with a 400)."""
    pytest.importorskip("agents")
    from openai import AsyncOpenAI

    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    called: list[str] = []
    client = AsyncOpenAI(base_url=served.url + "/v1", api_key="none", max_retries=0)
    agent = Agent(
        name="judge", instructions="Judge.", output_type=Verdict,
        tools=[function_tool(weather_tool(called))],
        model=OpenAIChatCompletionsModel(model="tiny", openai_client=client),
        model_settings=ModelSettings(max_tokens=200, temperature=0),
    )  # fmt: skip
    if stream:
        result = Runner.run_streamed(agent, "Is it sunny in Paris?")
        async for _ in result.stream_events():
            pass
    else:
        result = await Runner.run(agent, "Is it sunny in Paris?")
    assert isinstance(result.final_output, Verdict)
    assert called  # a turn with calls came first: tools and the schema in one request


@pytest.mark.parametrize("stream", [False, True])
async def test_a_pydantic_ai_agent_with_native_output_and_a_tool_ends_typed(served, stream):
    """pydantic-ai's `NativeOutput` (the schema as `response_format`) beside a tool,
    unchanged: tool calls, then an answer that parses as the output type."""
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent, NativeOutput
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    called: list[str] = []
    provider = OpenAIProvider(base_url=served.url + "/v1", api_key="none")
    agent = Agent(
        OpenAIChatModel("tiny", provider=provider), output_type=NativeOutput(Verdict),
        tools=[weather_tool(called)], model_settings={"max_tokens": 200, "temperature": 0.0},
    )  # fmt: skip
    if stream:
        async with agent.run_stream("Is it sunny in Paris?") as result:
            output = await result.get_output()
    else:
        output = (await agent.run("Is it sunny in Paris?")).output
    assert isinstance(output, Verdict)
    assert called
