"""The prisoner's dilemma (Prompt Choreography §3, appendix C): the leakage study.

Two players each have a private system prompt and a private plan, talk in
public for `rounds` rounds, then decide in private. Each public utterance is
encoded while attending to its speaker's private context, so when the other
player attends to it, that context leaks; the engine's leak policy (or
`leak_policy` here) decides what happens. Payoffs (T, R, P, S) = (5, 3, 1, 0).
"""

from __future__ import annotations

from typing import Literal

import anyio
from pydantic import BaseModel, ConfigDict

from corps.agents import Agent, Runtime
from corps.cache.handle import Handle
from corps.cache.visibility import Private
from corps.patterns import forms
from corps.patterns.params import Count, Temperature, Tokens, TopP
from corps.patterns.parsing import parse_decision
from corps.patterns.result import PatternResult
from corps.patterns.run import Run, first_error

PAYOFFS = dict(R=3, S=0, T=5, P=1)
SYSTEM = (
    "Your name is {name}, and you are a participant in the Prisoner's Dilemma with the "
    "following payoffs:\n\nIf you both cooperate: You will each receive {R} points.\n"
    "If one of you cooperates and the other defects: The cooperator will receive {S} points "
    "while the defector receives {T} points.\nIf you both defect: You will each receive {P} "
    "points.\n\nThe game will consist of a private planning phase, {rounds} turns of open "
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
SCORES = {
    ("COOPERATE", "COOPERATE"): (3, 3),
    ("COOPERATE", "DEFECT"): (0, 5),
    ("DEFECT", "COOPERATE"): (5, 0),
    ("DEFECT", "DEFECT"): (1, 1),
}


class Turn(BaseModel):
    """What the pattern asks a player to do; the public history travels as handles."""

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)
    kind: Literal["plan", "speak", "decide"]
    history: tuple[Handle, ...] = ()
    max_tokens: Tokens = 48
    temperature: Temperature = 0.7
    top_p: TopP = 0.95
    seed: int | None = None
    index: int = 0  # the run's turn index (keys a Replay)
    force: tuple[int, ...] = ()  # replayed tokens (equal-work benchmarks)
    logprobs: bool = False  # note each token's log-probability (fidelity)
    constrained: bool = True  # a decision is JSON of forms.DECISION


class Player(Agent):
    """A player: private system prompt, private plan, public talk, private decision."""

    other: str = ""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.private: list[Handle] = []  # its private prompts, for the run's record

    async def handle(self, turn: Turn) -> Handle:
        kw = dict(
            max_tokens=turn.max_tokens,
            temperature=turn.temperature,
            top_p=turn.top_p,
            seed=turn.seed,
            logprobs=turn.logprobs,
        )
        if turn.force:
            kw.update(force=turn.force, max_tokens=len(turn.force))
        if turn.kind == "plan":
            self.plan_prompt = await self.prefill(
                PLAN, parents=[self.system_prompt], visibility=Private()
            )
            self.private.append(self.plan_prompt)
            self.plan = await self.think(parents=[self.system_prompt, self.plan_prompt], **kw)
            return self.plan
        private = [self.system_prompt, self.plan_prompt, self.plan]
        if turn.kind == "speak":  # public, but encoded attending to the private plan
            return await self.decode(
                parents=[*private, *turn.history], header=f"To {self.other}: ", **kw
            )
        decide = await self.prefill(DECIDE, parents=private, visibility=Private())
        self.private.append(decide)
        kw |= forms.only(turn.constrained, forms.decision(turn.max_tokens))
        # the decision is parsed, never read by another turn
        return await self.think(parents=[*private, *turn.history, decide], final=True, **kw)


def player(
    name: str, other: str, strategy: str, rounds: int, leak_policy: str | None
) -> type[Player]:
    extra = ALWAYS_DEFECT.format(other=other) if strategy == "defect" else ""
    system = SYSTEM.format(name=name, extra=extra, rounds=rounds, **PAYOFFS)
    attrs = {"system": system, "other": other, "leak_policy": leak_policy}
    return type(f"{name}Player", (Player,), attrs)


async def prisoners_dilemma(
    rt: Runtime,
    *,
    alice: Literal["defect", "free"] = "defect",
    bob: Literal["defect", "free"] = "free",
    rounds: Count = 2,
    alice_first: bool = True,
    leak_policy: Literal["allow", "warn", "deny", "reencode"] | None = None,
    max_tokens: int = 48,
    temperature: float = 0.7,
    top_p: float = 0.95,
    seed: int | None = None,
    constrained: bool = True,
) -> PatternResult:
    """Alice and Bob plan in private, talk in public, decide in private.

    `alice` / `bob`: "defect" (told to always defect and manipulate) or "free".
    `leak_policy` overrides the engine's for the players' calls. `constrained`: each
    decision is JSON with a COOPERATE / DEFECT field (`corps.patterns.forms`); False
    decodes it free and parses.
    """
    async with Run(
        rt,
        "prisoners_dilemma",
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
    ) as run:
        names = {}
        for me, other, strategy in (("Alice", "Bob", alice), ("Bob", "Alice", bob)):
            cls = player(me, other, strategy, rounds, leak_policy)
            names[me] = await run.agent(me.lower(), cls)
        order = ["Alice", "Bob"] if alice_first else ["Bob", "Alice"]

        def turn(kind: str, history=()) -> Turn:
            t = run.turn([])  # the run's sampling settings and next seed
            return Turn(
                kind=kind,
                history=tuple(history),
                max_tokens=t.max_tokens,
                temperature=t.temperature,
                top_p=t.top_p,
                seed=t.seed,
                index=t.index,
                force=t.force,
                logprobs=t.logprobs,
                constrained=constrained,
            )

        async def ask(me: str, t: Turn) -> Handle:
            h = await rt.ask(names[me], t)
            run.record(t.index, h)
            return h

        plans = {}

        async def plan(me: str, t: Turn) -> None:
            plans[me] = await ask(me, t)

        run.stage("plan")
        with first_error():
            async with anyio.create_task_group() as tg:  # both plan at once: one batch
                for me in order:
                    tg.start_soon(plan, me, turn("plan"))
        run.messages.extend(plans[me] for me in order)
        history: list[Handle] = []
        for r in range(1, rounds + 1):
            run.stage(f"talk, round {r} of {rounds}")
            for me in order:
                history.append(await ask(me, turn("speak", history)))
                run.messages.append(history[-1])
        decisions, texts = {}, {}
        run.stage("decide")
        for me in order:
            h = await ask(me, turn("decide", history))
            run.messages.append(h)
            texts[me] = h.text
            decisions[me] = parse_decision(h.text)
            if decisions[me] is None:
                run.error(f"{me}: no decision in {h.text!r}; counted as COOPERATE")
        for me in order:  # the players' private prompts are messages of the run too
            run.messages.extend(rt.agent(names[me]).private)
        moves = (decisions["Alice"] or "COOPERATE", decisions["Bob"] or "COOPERATE")
        score = SCORES[moves]
        return run.result(
            f"Alice {moves[0]}, Bob {moves[1]}",
            dict(
                decisions=decisions,
                scores=dict(Alice=score[0], Bob=score[1]),
                transcript=[h.text for h in history],
                decision_texts=texts,
            ),
        )
