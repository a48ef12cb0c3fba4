"""A pydantic-ai agent, unchanged, streaming its run from `corps serve`.

Start a server (`corps serve`), then `python examples/serve_pydantic_ai.py`. The agent
has one function tool and streams its run (`Agent.run_stream`): the first step's tool
call arrives as tool-call deltas, pydantic-ai assembles and runs it, and the next
step streams the answer as text. A small capability forces the tool on the first
step and answers in text after it (a 135M model left to choose rarely calls a tool,
and once it has, keeps calling it), the way pydantic-ai's docs vary `tool_choice`
per step.

Needs `pip install 'pydantic-ai-slim[openai]'`.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import Annotated

from pydantic import Field
from pydantic_ai import Agent
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

CALLED: list[str] = []  # the cities the tool was run for


def get_weather(city: Annotated[str, Field(max_length=24)]) -> str:
    """The weather in a city."""
    CALLED.append(city)
    return f"It is sunny in {city}."


@dataclass
class ToolFirst(AbstractCapability):
    """Force a call of `get_weather` on the run's first step; an answer in text after."""

    def get_model_settings(self):
        return lambda ctx: {"tool_choice": ["get_weather"] if ctx.run_step <= 1 else "none"}


async def run(base_url: str, model: str, api_key: str = "none", max_tokens: int = 48) -> dict:
    """One streamed run; returns the answer, the tool's runs and the streamed text."""
    provider = OpenAIProvider(base_url=base_url, api_key=api_key)
    agent = Agent(
        OpenAIChatModel(model, provider=provider),
        instructions="Answer with the weather.",
        tools=[get_weather],
        capabilities=[ToolFirst()],
        model_settings={"max_tokens": max_tokens, "temperature": 0.0},
    )
    CALLED.clear()
    async with agent.run_stream("What is the weather in Paris?") as result:
        pieces = [text async for text in result.stream_text(delta=True)]
        output = await result.get_output()
    return {"output": output, "called": list(CALLED), "pieces": pieces}


def main() -> None:
    base = os.environ.get("CORPS_URL", "http://127.0.0.1:8000/v1")
    key = os.environ.get("CORPS_API_KEY", "none")
    model = os.environ.get("CORPS_MODEL", "smollm2-135m")
    out = asyncio.run(run(base, model, key))
    print("tool ran for:", out["called"])
    print("answer:", out["output"])


if __name__ == "__main__":
    main()
