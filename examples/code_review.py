"""A three-agent code review: a writer drafts, two reviewers critique the draft
without seeing each other's critique (each verdict constrained to a schema), and
the writer revises reading both.

    corps run examples/code_review.py                              # leaks said, with the fix
    corps run examples/code_review.py --set public_prompts=true    # leak-free, as cheap
    corps run examples/code_review.py --leak-policy reencode       # leak-free, re-encoded
    corps run examples/code_review.py --mode baseline              # what it saves

docs/agents.md, "Leak-free and cheap", has the encoded tokens of each.
"""

from __future__ import annotations

from typing import Literal

import anyio
from pydantic import BaseModel, Field

from corps.agents import Agent, Runtime
from corps.cache import Handle, Shared


class Revise(BaseModel):  # a payload of handles: no model_config needed
    task: Handle
    draft: Handle
    reviews: tuple[Handle, ...]


class Verdict(BaseModel):
    decision: Literal["approve", "revise"]
    reason: str = Field(max_length=80)


class Writer(Agent):
    system = "You write short, correct Python functions."
    max_tokens = 64

    async def handle(self, msg: Handle | Revise) -> Handle:
        if isinstance(msg, Handle):  # the task: a first draft
            parents = [self.system_prompt, msg]
        else:  # revise, reading both reviews
            ask = await self.prefill("Revise the function, following both reviews.", role="user")
            parents = [self.system_prompt, msg.task, msg.draft, *msg.reviews, ask]
        return await self.decode(parents=parents, max_tokens=self.max_tokens, temperature=0.0)


class Reviewer(Agent):
    system = "You review Python code for bugs and clarity."

    async def handle(self, draft: Handle) -> Handle:
        # each review is shared with the writer only: the other reviewer never reads it
        seen = Shared({self.name, "writer"})
        ask = await self.prefill("Review the function above.", role="user", visibility=seen)
        return await self.decode(
            parents=[self.system_prompt, draft, ask], schema=Verdict, max_tokens=48,
            temperature=0.0, visibility=seen,
        )  # fmt: skip


async def run(
    rt: Runtime,
    task: str = "Write a function that returns the n-th Fibonacci number.",
    public_prompts: bool = False,
) -> str:
    seen = "public" if public_prompts else "private"
    await rt.spawn(Writer, "writer", system_visibility=seen)
    for name in ("alice", "bob"):
        await rt.spawn(Reviewer, name, system_visibility=seen)
    t = await rt.engine.prefill(task, role="user")
    draft = await rt.ask("writer", t)
    reviews = await rt.ask_many([("alice", draft), ("bob", draft)])
    revised = await rt.ask("writer", Revise(task=t, draft=draft, reviews=tuple(reviews)))
    return revised.text


if __name__ == "__main__":
    from corps.engine import Engine

    async def main() -> None:
        async with Engine.open("smollm2-135m") as engine, Runtime(engine) as rt:
            print(await run(rt))

    anyio.run(main)
