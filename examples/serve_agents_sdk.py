"""An OpenAI Agents SDK agent, unchanged, streaming its turn from `corps serve`.

Start a server (`corps serve`), then `python examples/serve_agents_sdk.py`. The agent
has one function tool; its turn is streamed (`Runner.run_streamed`), so the tool call
arrives as tool-call deltas, which the SDK assembles and runs. `tool_choice` is
"required" (a 135M model rarely chooses a tool on its own), one call per reply
(`parallel_tool_calls=False`: a small model otherwise writes call after call), and
the agent stops at the tool's output (`tool_use_behavior="stop_on_first_tool"`).
The city's `max_length` becomes part of the tool's schema, which the server's
grammar enforces: even a model that rambles closes the call within its budget.

Needs `pip install openai-agents`.
"""

from __future__ import annotations

import asyncio
import os
from typing import Annotated

from openai import AsyncOpenAI
from pydantic import Field

from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)

CALLED: list[str] = []  # the cities the tool was run for


@function_tool
def get_weather(city: Annotated[str, Field(max_length=24)]) -> str:
    """The weather in a city."""
    CALLED.append(city)
    return f"It is sunny in {city}."


async def run(base_url: str, model: str, api_key: str = "none", max_tokens: int = 64) -> dict:
    """One streamed agent turn; returns the final output, the tool's runs and the
    streamed events the SDK saw."""
    set_tracing_disabled(True)  # no OpenAI tracing upload from a local server's agent
    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    agent = Agent(
        name="forecaster",
        instructions="Answer with the weather.",
        model=OpenAIChatCompletionsModel(model=model, openai_client=client),
        model_settings=ModelSettings(
            tool_choice="required", parallel_tool_calls=False, max_tokens=max_tokens, temperature=0
        ),
        tools=[get_weather],
        tool_use_behavior="stop_on_first_tool",
    )
    CALLED.clear()
    result = Runner.run_streamed(agent, "What is the weather in Paris?")
    kinds = [event.type async for event in result.stream_events()]
    return {"output": result.final_output, "called": list(CALLED), "events": kinds}


def main() -> None:
    base = os.environ.get("CORPS_URL", "http://127.0.0.1:8000/v1")
    key = os.environ.get("CORPS_API_KEY", "none")
    model = os.environ.get("CORPS_MODEL", "smollm2-135m")
    out = asyncio.run(run(base, model, key))
    print("tool ran for:", out["called"])
    print("final output:", out["output"])


if __name__ == "__main__":
    main()
