"""Branch-solve-merge for constrained story writing (Saha et al.; Prompt Choreography §5).

A branch call splits the concept list into two groups; two stories are written
in parallel, one per group, each writer reading the shared instruction (one
message) and its group; a merge call attends to the merge instructions and
both stories. `layout="serial"` places the stories one after the other in the
merge's context; `layout="parallel"` places both at the same offset, overlapping
(the paper's blockage study). The result reports which concepts the final story
contains.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field

from corps.agents import Runtime
from corps.patterns import forms
from corps.patterns.params import Temperature, Text, Tokens, TopP
from corps.patterns.parsing import parse_groups
from corps.patterns.result import PatternResult
from corps.patterns.run import Run
from corps.patterns.samples import CONCEPTS

BRANCH = (
    "Split these concepts into two groups of similar size for two short stories. Reply as "
    "'Group 1: ...' and 'Group 2: ...', concepts separated by commas.\n\nConcepts: {concepts}"
)
SOLVE = "Write a short story (a few sentences) that uses all of the concepts given next."
GROUP = "Concepts: {concepts}."
MERGE = (
    "Merge the two stories below into one coherent short story that keeps every concept they use."
)


def present(story: str, concepts: list[str]) -> list[str]:
    return [c for c in concepts if re.search(rf"\b{re.escape(c)}", story, flags=re.IGNORECASE)]


async def branch_solve_merge(
    rt: Runtime,
    concepts: Annotated[tuple[Text, ...], Field(min_length=2)] = CONCEPTS,
    *,
    layout: Literal["serial", "parallel"] = "serial",
    max_tokens: Tokens = 128,
    temperature: Temperature = 0.7,
    top_p: TopP = 0.95,
    seed: int | None = None,
    constrained: bool = True,
) -> PatternResult:
    """Split `concepts` in two, write a story per group in parallel, merge them.

    `constrained`: the split names the first group's concepts (1 to all but one of
    them), the second group is the rest (`corps.patterns.forms`); False decodes
    both groups free and parses."""
    async with Run(
        rt,
        "branch_solve_merge",
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
    ) as run:
        brancher, writer, merger = [await run.agent(r) for r in ("branch", "solve", "merge")]
        listed = ", ".join(concepts)
        # the three instructions depend on nothing decoded: encoded in one step (on a
        # GPU each prefill step costs its launches, whatever its length)
        branch, solve, merge = await run.prefill_many(
            [dict(message=BRANCH.format(concepts=listed)), dict(message=SOLVE),
             dict(message=MERGE)]
        )  # fmt: skip
        form = forms.only(constrained, forms.groups(concepts))
        # the split is parsed into new messages, never read itself
        (split,) = await run.ask(
            brancher, run.turn([branch], header="Group 1:", final=True, **form)
        )
        if constrained:  # the second group is what the first does not name
            groups = forms.rest_of(split.text.removeprefix("Group 1:"), concepts)
        else:
            groups = parse_groups("Group 1:" + split.text, concepts)
        if groups is None:
            run.error(f"branch: no two groups in {split.text!r}; splitting the list in half")
            half = (len(concepts) + 1) // 2
            groups = (list(concepts[:half]), list(concepts[half:]))
        # The instruction both writers share is one message, encoded once; each
        # writer reads it followed by its own group.
        asks = await run.prefill_many(
            [dict(message=GROUP.format(concepts=", ".join(g)), parents=[solve]) for g in groups]
        )
        stories = await run.ask(writer, *[run.turn([solve, a], header="Story: ") for a in asks])
        offsets, new_offset = None, None
        if layout == "parallel":
            at = merge.offset + merge.length
            offsets = [None, at, at]
            new_offset = at + max(s.length for s in stories)
        (final,) = await run.ask(
            merger,
            run.turn(
                [merge, *stories],
                offsets=offsets,
                new_offset=new_offset,
                header="Story: ",
                repair=run.decision_repair,
                final=True,
            ),
        )
        used = present(final.text, list(concepts))
        return run.result(
            final.text,
            dict(
                layout=layout,
                groups=[list(g) for g in groups],
                concepts_present=used,
                coverage=len(used) / len(concepts) if concepts else 0.0,
            ),
        )
