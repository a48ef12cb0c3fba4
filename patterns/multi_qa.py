"""Multi-QA, the blockage study (Prompt Choreography §5).

Two questions are prefilled independently (neither attends to the other), then
answered in one decode over [system, question 1, question 2]. With
`layout="serial"` the questions sit one after the other; with "parallel" both
sit at the same offset, overlapping. Choreography's blockage shows up as an
answer that ignores one question; with `answers` given, the result reports
which questions were answered (each answer as a word anywhere in the reply).
"""

from __future__ import annotations

from typing import Literal

from corps.agents import Runtime
from corps.patterns import forms
from corps.patterns.params import Temperature, Texts, Tokens, TopP
from corps.patterns.parsing import answered
from corps.patterns.result import PatternResult
from corps.patterns.run import Run
from corps.patterns.samples import ANSWERS, QUESTIONS

SYSTEM = "Answer every question you are given, as a numbered list, one short line each."


async def multi_qa(
    rt: Runtime,
    questions: Texts = QUESTIONS,
    answers: tuple[str, ...] | None = ANSWERS,
    *,
    layout: Literal["serial", "parallel"] = "serial",
    max_tokens: Tokens = 48,
    temperature: Temperature = 0.7,
    top_p: TopP = 0.95,
    seed: int | None = None,
    constrained: bool = True,
) -> PatternResult:
    """Prefill the questions independently, answer them all in one decode.

    `constrained`: the reply is one numbered line per question (`corps.patterns.forms`);
    False decodes it free."""
    async with Run(
        rt, "multi_qa", max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed
    ) as run:
        answerer = await run.agent("answerer")
        system = await run.prefill(SYSTEM, role="system")
        at = system.offset + system.length
        qs = []
        if layout == "parallel":  # every question at one offset: all in one prefill step
            items = [dict(message=q, parents=[system], new_offset=at) for q in questions]
            qs = await run.prefill_many(items)
        for q in questions if layout == "serial" else ():  # each after the one before
            h = await run.prefill(q, parents=[system], new_offset=at)
            qs.append(h)
            at += h.length
        offsets, new_offset = None, None
        if layout == "parallel":
            offsets = [None] + [q.offset for q in qs]
            new_offset = qs[0].offset + max(q.length for q in qs)
        (reply,) = await run.ask(
            answerer,
            run.turn(
                [system, *qs],
                offsets=offsets,
                new_offset=new_offset,
                header="1.",
                final=True,
                **forms.only(constrained, forms.numbered(len(questions), max_tokens)),
            ),
        )
        details: dict = dict(layout=layout)
        if answers is not None:
            if len(answers) != len(questions):
                run.error("answers: not one per question; not checked")
            else:
                details["answered"] = answered(reply.text, answers)
        return run.result(reply.text, details)
