"""The prisoner's dilemma (Prompt Choreography section 3, appendix C) through its built-in pattern.

Alice and Bob each have a private system prompt and a private plan, talk in
public for two rounds, then decide in private. Each public utterance is encoded
while attending to its speaker's private context, so when the other player
attends to it, that private context leaks (the paper's point).

    python examples/prisoners_dilemma.py --policy warn       # flags every leak
    python examples/prisoners_dilemma.py --policy reencode   # none remain
    python examples/prisoners_dilemma.py --policy deny       # first leaking call fails

The same game from the CLI: `corps run prisoners-dilemma --leak-policy reencode`.
"""

from __future__ import annotations

import anyio
import typer

from corps.agents import AgentError, Runtime
from corps.engine import Engine
from corps.patterns import PatternResult, prisoners_dilemma


async def play(engine: Engine, *, policy: str, max_tokens: int = 48) -> PatternResult:
    """One game with the players' calls under `policy`."""
    async with Runtime(engine) as rt:
        return await prisoners_dilemma(rt, leak_policy=policy, max_tokens=max_tokens, seed=0)


def main(
    policy: str = typer.Option("warn", help="allow, warn, deny or reencode"),
    model: str = typer.Option("smollm2-135m"),
    max_tokens: int = typer.Option(48),
) -> None:
    async def run() -> None:
        async with Engine.open(model) as engine:
            try:
                game = await play(engine, policy=policy, max_tokens=max_tokens)
            except AgentError as exc:
                print(f"stopped: {exc}")
                return
            for text in game.details["transcript"]:
                print(f"{text}\n")
            for name, text in game.details["decision_texts"].items():
                print(f"[{name}, private decision] {text}\n")
            print(game.answer)
            print(f"{game.leaks} leaks recorded under leak_policy={policy!r}")
            for leak in engine.leaks():
                print(f"  {leak.reader} <- message {leak.parent}: hidden {sorted(leak.sources)}")

    anyio.run(run)


if __name__ == "__main__":
    typer.run(main)
