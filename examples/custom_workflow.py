"""A workflow of your own for `corps run`: define `async def run(rt, **params)`.

    corps run examples/custom_workflow.py --set question='"What is 12*12?"'

Two solvers answer the same once-encoded question at the same time (their decodes
share the engine's steps), each sampling with its own seed; a checker reads both
answers and picks one. Uses only the public API.
"""

from __future__ import annotations

import anyio

from corps.agents import Agent, Runtime
from corps.cache import Handle


class Solver(Agent):
    async def handle(self, q: Handle) -> Handle:
        seed = sum(map(ord, self.name))  # its own, reproducible: solver-a and solver-b differ
        return await self.decode(parents=[q], max_tokens=48, temperature=0.7, seed=seed)


async def run(rt: Runtime, question: str = "What is 12 times 12?") -> dict:
    engine = rt.engine
    q = await engine.prefill(f"Solve briefly: {question}")
    for name in ("solver-a", "solver-b"):
        await rt.spawn(Solver, name)
    answers: dict[str, Handle] = {}

    async def ask(name: str) -> None:
        answers[name] = await rt.ask(name, q)

    async with anyio.create_task_group() as tg:  # both at once
        tg.start_soon(ask, "solver-a")
        tg.start_soon(ask, "solver-b")
    first, second = answers["solver-a"], answers["solver-b"]
    check = await engine.prefill("Which answer above is right? Reply with the number only.")
    verdict = await engine.decode(parents=[q, first, second, check], max_tokens=16)
    return dict(answers=[first.text, second.text], verdict=verdict.text)
