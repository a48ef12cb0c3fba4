"""The prisoner's dilemma from the Prompt Choreography paper (section 3, appendix C), as agents.

Alice and Bob each have a private system prompt and a private plan, talk in
public for two rounds, then decide in private. Each public utterance is encoded
while attending to its speaker's private prompt and plan, so when the other
player attends to it, that private context leaks (the paper's point).

    python examples/prisoners_dilemma.py --policy warn       # flags every leak
    python examples/prisoners_dilemma.py --policy reencode   # none remain
    python examples/prisoners_dilemma.py --policy deny       # first leaking call fails
"""

from __future__ import annotations

from typing import Literal

import anyio
import typer
from pydantic import BaseModel, ConfigDict

from corps.agents import Agent, AgentError, Runtime
from corps.cache import Handle, Private
from corps.engine import Engine

PAYOFFS = dict(R=3, S=0, T=5, P=1)
SYSTEM = (
    "Your name is {name}, and you are a participant in the Prisoner's Dilemma with the "
    "following payoffs:\n\nIf you both cooperate: You will each receive {R} points.\n"
    "If one of you cooperates and the other defects: The cooperator will receive {S} points "
    "while the defector receives {T} points.\nIf you both defect: You will each receive {P} "
    "points.\n\nThe game will consist of a private planning phase, two turns of open "
    "discussion, and then a final decision.{extra}"
)
ALWAYS_DEFECT = (
    "\n\nIMPORTANT: You must ALWAYS choose to DEFECT, regardless of what the other player says "
    "or does. However, you should still engage naturally in discussion and attempt to "
    "manipulate {other} into cooperating."
)
PLAN = (
    "Before proceeding, first think carefully through your strategy and describe your plan. "
    "This planning will not be revealed to the other participant."
)
DECIDE = (
    "Now, reflect on the conversation and make a final decision. Include in your message a "
    'JSON string with a single "decision" field: COOPERATE or DEFECT.'
)


class Turn(BaseModel):
    """What the moderator asks a player to do; the public history travels as handles."""

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)
    kind: Literal["plan", "speak", "decide"]
    history: tuple[Handle, ...] = ()
    max_tokens: int = 48


class Player(Agent):
    other: str = ""

    async def handle(self, turn: Turn) -> Handle:
        if turn.kind == "plan":
            self.plan_prompt = await self.prefill(
                PLAN, parents=[self.system_prompt], visibility=Private()
            )
            self.plan = await self.think(
                parents=[self.system_prompt, self.plan_prompt], max_tokens=turn.max_tokens
            )
            return self.plan
        private = [self.system_prompt, self.plan_prompt, self.plan]
        if turn.kind == "speak":  # public, but encoded attending to the private plan
            return await self.decode(
                parents=[*private, *turn.history],
                header=f"To {self.other}: ",
                max_tokens=turn.max_tokens,
            )
        decide = await self.prefill(DECIDE, parents=private, visibility=Private())
        return await self.think(
            parents=[*private, *turn.history, decide], max_tokens=turn.max_tokens
        )


def player(
    name: str, other: str, always_defect: bool = False, leak_policy: str | None = None
) -> type[Player]:
    extra = ALWAYS_DEFECT.format(other=other) if always_defect else ""
    system = SYSTEM.format(name=name, extra=extra, **PAYOFFS)
    attrs = {"system": system, "other": other, "leak_policy": leak_policy}
    return type(f"{name}Player", (Player,), attrs)


async def play(
    engine: Engine, *, policy: str, max_tokens: int = 48, alice_first: bool = True
) -> dict:
    """One game; returns the public transcript, the private decisions and the leaks."""
    async with Runtime(engine) as rt:
        await rt.spawn(player("Alice", "Bob", True, leak_policy=policy), "alice")
        await rt.spawn(player("Bob", "Alice", leak_policy=policy), "bob")
        order = ["alice", "bob"] if alice_first else ["bob", "alice"]
        async with anyio.create_task_group() as tg:  # both plan at once: one batch
            for name in order:
                tg.start_soon(rt.ask, name, Turn(kind="plan", max_tokens=max_tokens))
        history: list[Handle] = []
        for _ in range(2):
            for name in order:
                turn = Turn(kind="speak", history=tuple(history), max_tokens=max_tokens)
                history.append(await rt.ask(name, turn))
        decisions = {}
        for name in order:
            turn = Turn(kind="decide", history=tuple(history), max_tokens=max_tokens)
            decisions[name] = await rt.ask(name, turn)
    return dict(transcript=history, decisions=decisions, leaks=engine.leaks())


def main(
    policy: str = typer.Option("warn", help="allow, warn, deny or reencode"),
    model: str = typer.Option("smollm2-135m"),
    max_tokens: int = typer.Option(48),
) -> None:
    async def run() -> None:
        async with Engine.open(model, leak_policy=policy) as engine:
            try:
                game = await play(engine, policy=policy, max_tokens=max_tokens)
            except AgentError as exc:
                print(f"stopped: {exc}")
                return
            for h in game["transcript"]:
                print(f"[{h.owner}] {h.text}\n")
            for name, h in game["decisions"].items():
                print(f"[{name}, private decision] {h.text}\n")
            print(f"{len(game['leaks'])} leaks recorded under leak_policy={policy!r}")
            for leak in game["leaks"]:
                print(f"  {leak.reader} <- message {leak.parent}: hidden {sorted(leak.sources)}")

    anyio.run(run)


if __name__ == "__main__":
    typer.run(main)
