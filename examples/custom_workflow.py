"""A workflow of your own for `corps run`: define `async def run(rt, **params)`.

    corps run examples/custom_workflow.py --set question='"What is 12*12?"'

Two solvers answer in parallel from one shared, once-encoded system prompt; a
checker reads both answers and picks one. Uses only the public API.
"""

from __future__ import annotations

from corps.agents import Agent, Runtime
from corps.cache import Handle


class Solver(Agent):
    async def handle(self, q: Handle) -> Handle:
        return await self.decode(parents=[q], max_tokens=48, temperature=0.7, seed=len(self.name))


async def run(rt: Runtime, question: str = "What is 12 times 12?") -> dict:
    engine = rt.engine
    q = await engine.prefill(f"Solve briefly: {question}")
    for name in ("solver-a", "solver-b"):
        await rt.spawn(Solver, name)
    first = await rt.ask("solver-a", q)
    second = await rt.ask("solver-b", q)
    check = await engine.prefill("Which answer above is right? Reply with the number only.")
    verdict = await engine.decode(parents=[q, first, second, check], max_tokens=16)
    return dict(answers=[first.text, second.text], verdict=verdict.text)
