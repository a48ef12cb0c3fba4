"""Parallel debate, MADpar (Du et al.; Prompt Choreography fig. 2 and 7).

`agents` identical agents answer for `rounds` rounds. In round 1 each attends
to the instructions; in later rounds to the instructions, its own earlier
answers, the *other* agents' previous-round answers and one shared "update"
prompt. Each round's answers decode in parallel, so each answer is encoded once
and reused by every reader. The final answer is the majority of the last
round's \\boxed{} answers (ties to the lowest agent).
"""

from __future__ import annotations

from corps.agents import Runtime
from corps.patterns import forms
from corps.patterns.params import Count, Temperature, Text, Tokens, TopP
from corps.patterns.parsing import majority, normalize, parse_answer
from corps.patterns.result import PatternResult
from corps.patterns.run import Run
from corps.patterns.samples import QUESTION

INSTRUCTIONS = (
    "Answer the question below. Reason briefly, then give the final answer in \\boxed{{}}."
    "\n\nQuestion: {question}"
)
UPDATE = (
    "Those are the other agents' latest answers. Using them as extra advice, give your "
    "updated answer, ending with the final answer in \\boxed{}."
)


async def parallel_debate(
    rt: Runtime,
    question: Text = QUESTION,
    *,
    agents: Count = 3,
    rounds: Count = 3,
    max_tokens: Tokens = 96,
    temperature: Temperature = 0.7,
    top_p: TopP = 0.95,
    seed: int | None = None,
    constrained: bool = True,
) -> PatternResult:
    """`agents` agents answer in parallel for `rounds` rounds, reading each other.

    `constrained`: each answer ends boxed (`corps.patterns.forms`); False decodes free."""
    async with Run(
        rt,
        "parallel_debate",
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
    ) as run:
        names = [await run.agent(f"agent{k + 1}") for k in range(agents)]
        texts = [INSTRUCTIONS.format(question=question), *([UPDATE] if rounds > 1 else [])]
        instr, *rest = await run.prefill_many([dict(message=t) for t in texts])
        update = rest[0] if rest else None
        own: list[list] = [[] for _ in names]
        previous: list = []
        for r in range(1, rounds + 1):
            run.stage(f"round {r} of {rounds}")
            calls = []
            for k, name in enumerate(names):
                others = [h for j, h in enumerate(previous) if j != k]
                parents = [instr, *own[k], *others, *([update] if others else [])]
                boxed = forms.only(constrained, forms.boxed(max_tokens))
                last = r == rounds  # the last round's answers are parsed, not read
                turn = run.turn(parents, header=f"Agent {k + 1}: ", final=last, **boxed)
                calls.append((name, turn))
            previous = await run.parallel(calls)
            for k, h in enumerate(previous):
                own[k].append(h)
        answers = []
        for k, h in enumerate(previous):
            # the header's agent number is not an answer: parse what the agent wrote
            a = normalize(parse_answer(h.text.removeprefix(f"Agent {k + 1}: ")))
            if a is None:
                run.error(f"agent {k + 1}: no answer in {h.text!r}")
            answers.append(a)
        winner, counts = majority([a for a in answers if a is not None])
        return run.result(
            winner,
            dict(answers=answers, counts=counts, consensus=len(set(answers)) == 1),
        )
