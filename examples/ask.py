"""Two users' questions share one encoded system prompt; both answers decode in parallel.

Run: python examples/ask.py
"""

from __future__ import annotations

import anyio

from corps.engine import Engine


async def main() -> None:
    async with Engine.open("smollm2-135m") as engine:
        system = await engine.prefill("You are a concise assistant.", role="system")
        questions = await engine.prefill_many(
            [dict(message=q, parents=[system]) for q in ("What is 7*6?", "Name a primary colour.")]
        )
        answers = await engine.decode_many(
            [dict(parents=[system, q], max_tokens=48) for q in questions]
        )
        for q, a in zip(questions, answers, strict=True):
            print(f"Q: {q.text}\nA: {a.text}\n")
        print(engine.stats())


if __name__ == "__main__":
    anyio.run(main)
