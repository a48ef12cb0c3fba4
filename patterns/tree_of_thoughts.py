"""Tree of thoughts, one level (Yao et al.; Prompt Choreography fig. 7).

`branches` candidate solutions decode in parallel from one propose instruction;
`voters` vote in parallel, each attending to the vote instruction, every
candidate and one shared "now vote" prompt (encoded once, reused by all); the
winner by majority (ties to the lower number); a final solve attends to the
finish instruction, the winning candidate only (repositioned after it) and a
closing prompt.
"""

from __future__ import annotations

from corps.agents import Runtime
from corps.patterns import forms
from corps.patterns.params import Count, Temperature, Text, Tokens, TopP
from corps.patterns.parsing import majority, parse_answer, parse_choice
from corps.patterns.result import PatternResult
from corps.patterns.run import Run
from corps.patterns.samples import QUESTION

PROPOSE = (
    "You are a careful problem solver. Solve the problem below step by step and end with "
    "the final answer in \\boxed{{}}.\n\nProblem: {question}"
)
VOTE = (
    "Several candidate solutions to a problem follow. Judge which one is most likely "
    "correct.\n\nProblem: {question}"
)
VOTE_NOW = "Which solution is best? Reply with 'BEST CHOICE: <number>' for a number from 1 to {n}."
FINISH = (
    "Here is a problem and a proposed solution. Check the solution and state the final "
    "answer in \\boxed{{}}.\n\nProblem: {question}"
)
FINISH_NOW = "Check the solution above and give the final answer in \\boxed{}."


async def tree_of_thoughts(
    rt: Runtime,
    question: Text = QUESTION,
    *,
    branches: Count = 8,
    voters: Count = 4,
    vote_tokens: Tokens = 12,
    max_tokens: Tokens = 96,
    temperature: Temperature = 0.7,
    top_p: TopP = 0.95,
    seed: int | None = None,
    constrained: bool = True,
) -> PatternResult:
    """Propose `branches` solutions, let `voters` pick one, then solve from the winner.

    `constrained`: each vote is one of the candidate numbers and the final answer is
    boxed (`corps.patterns.forms`); False decodes them free and parses."""
    async with Run(
        rt,
        "tree_of_thoughts",
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
    ) as run:
        proposer, voter, solver = [await run.agent(r) for r in ("proposer", "voter", "solver")]
        # the three instructions are independent: encoded in one step, up front
        texts = [t.format(question=question) for t in (PROPOSE, VOTE, FINISH)]
        propose, vote, finish = await run.prefill_many([dict(message=t) for t in texts])
        proposals = await run.ask(
            proposer,
            *[run.turn([propose], header=f"Solution #{i + 1}:\n") for i in range(branches)],
        )
        vote_now = await run.prefill(VOTE_NOW.format(n=branches), parents=[vote, *proposals])
        ballots = await run.ask(
            voter,
            *[
                run.turn(
                    [vote, *proposals, vote_now],
                    header="BEST CHOICE: ",
                    max_tokens=vote_tokens,
                    repair=run.decision_repair,
                    final=True,  # a ballot is parsed, never read by another turn
                    **forms.only(constrained, forms.options(branches)),
                )
                for _ in range(voters)
            ],
        )
        votes = []
        for i, b in enumerate(ballots):
            choice = parse_choice("BEST CHOICE: " + b.text, branches)
            if choice is None:
                run.error(f"voter {i + 1}: no candidate number in {b.text!r}")
            else:
                votes.append(choice)
        winner, counts = majority(votes)
        if winner is None:
            run.error("no valid vote: the first candidate wins")
            winner = 1
        best = proposals[winner - 1]
        finish_now = await run.prefill(FINISH_NOW, parents=[finish, best])
        (final,) = await run.ask(
            solver,
            run.turn(
                [finish, best, finish_now],
                final=True,
                **forms.only(constrained, forms.boxed(max_tokens)),
            ),
        )
        answer = parse_answer(final.text)
        if answer is None:
            run.error(f"final solve: no answer in {final.text!r}")
        return run.result(
            answer if answer is not None else final.text,
            dict(votes=votes, counts=counts, winner=winner, final=final.text),
        )
