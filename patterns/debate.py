"""Iterative debate, MADiter (Liang et al.; Prompt Choreography fig. 7).

An affirmative and a negative debater take turns for up to `rounds` rounds;
each attends to its own instructions, the question and every debate turn so
far. After each round a moderator (its instructions, the question, this round's
turns and its own earlier verdicts) answers in JSON {"Reasoning", "Preference",
"Answer"}; it stops the debate when Preference is yes and Answer is given. If it
never does, a final judge call attends to the whole debate and answers.
"""

from __future__ import annotations

from corps.agents import Runtime
from corps.patterns import forms
from corps.patterns.params import Count, Temperature, Text, Tokens, TopP
from corps.patterns.parsing import parse_answer, parse_fields
from corps.patterns.result import PatternResult
from corps.patterns.run import Run
from corps.patterns.samples import QUESTION

AFFIRMATIVE = (
    "You are the affirmative side of a debate about the question below. Propose an answer "
    "with your reasoning; in later rounds defend it or correct it.\n\nQuestion: {question}"
)
NEGATIVE = (
    "You are the negative side of a debate about the question below. Find the flaws in the "
    "other side's answer and argue for a better one.\n\nQuestion: {question}"
)
MODERATOR = (
    "You moderate a debate about the question below. After each round, reply with JSON only: "
    '{{"Reasoning": "...", "Preference": "yes" or "no", "Answer": "..."}}. Preference is yes '
    "when one side is clearly right.\n\nQuestion: {question}"
)
JUDGE = "The debate is over. Give the final answer to the question in \\boxed{}."
VERDICT_HEADER = '{"Reasoning": "'


async def debate(
    rt: Runtime,
    question: Text = QUESTION,
    *,
    rounds: Count = 3,
    max_tokens: Tokens = 96,
    temperature: Temperature = 0.7,
    top_p: TopP = 0.95,
    seed: int | None = None,
    constrained: bool = True,
) -> PatternResult:
    """Affirmative vs negative for up to `rounds` rounds; a moderator may stop early.

    `constrained`: the moderator's verdict is JSON of its schema and the judge's answer
    is boxed (`corps.patterns.forms`); False decodes them free and parses."""
    async with Run(
        rt, "debate", max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed
    ) as run:
        aff, neg, mod = [await run.agent(r) for r in ("affirmative", "negative", "moderator")]
        texts = [t.format(question=question) for t in (AFFIRMATIVE, NEGATIVE, MODERATOR)]
        handles = await run.prefill_many([dict(message=t, role="system") for t in texts])
        instr = dict(zip((aff, neg, mod), handles, strict=True))
        history, verdicts, parsed = [], [], []
        stop_round, answer = None, None
        for r in range(1, rounds + 1):
            run.stage(f"round {r} of {rounds}")
            turns = []
            for side, name in ((aff, "Affirmative"), (neg, "Negative")):
                (turn,) = await run.ask(
                    side, run.turn([instr[side], *history], header=f"{name} (round {r}): ")
                )
                history.append(turn)
                turns.append(turn)
            verdict_form = forms.verdict(max_tokens) if constrained else dict(header=VERDICT_HEADER)
            (verdict,) = await run.ask(
                mod,
                run.turn(
                    [instr[mod], *verdicts, *turns], repair=run.decision_repair, **verdict_form
                ),
            )
            verdicts.append(verdict)
            obj = parse_fields(verdict.text, ("Reasoning", "Preference", "Answer"))
            if obj is None or "preference" not in obj:
                run.error(f"moderator round {r}: no verdict in {verdict.text!r}")
                parsed.append(None)
                continue  # keep debating
            parsed.append(obj)
            given = str(obj.get("answer", "")).strip()
            if str(obj.get("preference", "")).strip().lower() == "yes" and given:
                stop_round, answer = r, given
                break
        if answer is None:
            judge = await run.prefill(JUDGE, parents=[instr[mod], *history])
            boxed = forms.only(constrained, forms.boxed(max_tokens))
            (final,) = await run.ask(
                mod,
                run.turn(
                    [instr[mod], *history, judge], repair=run.decision_repair, final=True, **boxed
                ),
            )
            answer = parse_answer(final.text)
            if answer is None:
                run.error(f"judge: no answer in {final.text!r}")
                answer = final.text
        return run.result(
            answer,
            dict(
                rounds_run=len(verdicts),
                stop_round=stop_round,
                early_stop=stop_round is not None,
                verdicts=parsed,
            ),
        )
