"""Map-reduce summarisation (Parrot's document summary).

The document is split into chunks of about `chunk_tokens` tokens (on paragraph
or word boundaries); every chunk is summarised in parallel in one sentence,
each call attending to the shared map instruction and its chunk; then groups of
`fan_in` summaries are reduced, level after level, until one summary is left.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from corps.agents import Runtime
from corps.engine.errors import InvalidRequest
from corps.patterns.params import Temperature, Text, Tokens, TopP
from corps.patterns.result import PatternResult
from corps.patterns.run import Run
from corps.patterns.samples import DOCUMENT

MAP = "Summarise the following part of a document in one sentence."
REDUCE = "Combine the following partial summaries into one short summary of the whole."


def split(tokenizer, document: str, chunk_tokens: int) -> list[str]:
    """Chunks of at most ~chunk_tokens tokens, cut between words."""
    chunks, words, count = [], [], 0
    for word in document.split(" "):
        n = len(tokenizer(" " + word, add_special_tokens=False)["input_ids"])
        if words and count + n > chunk_tokens:
            chunks.append(" ".join(words))
            words, count = [], 0
        words.append(word)
        count += n
    if words:
        chunks.append(" ".join(words))
    return [c for c in chunks if c.strip()]


async def map_reduce(
    rt: Runtime,
    document: Text = DOCUMENT,
    *,
    chunk_tokens: Annotated[int, Field(ge=16)] = 512,
    fan_in: Annotated[int, Field(ge=2)] = 4,
    max_tokens: Tokens = 48,
    temperature: Temperature = 0.7,
    top_p: TopP = 0.95,
    seed: int | None = None,
) -> PatternResult:
    """Summarise chunks of `document` in parallel, then reduce `fan_in` at a time."""
    if fan_in < 2 or chunk_tokens < 16:
        raise InvalidRequest("map_reduce needs fan_in >= 2 and chunk_tokens >= 16")
    async with Run(
        rt, "map_reduce", max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed
    ) as run:
        mapper, reducer = await run.agent("map"), await run.agent("reduce")
        chunks = split(rt.engine.tokenizer, document, chunk_tokens)
        if not chunks:
            raise InvalidRequest("map_reduce needs a non-empty document")
        # both instructions at once: one prefill step, not two (each costs its launches)
        instr, reduce = await run.prefill_many([dict(message=MAP), dict(message=REDUCE)])
        parts = await run.prefill_many([dict(message=c, parents=[instr]) for c in chunks])
        level = await run.ask(
            mapper, *[run.turn([instr, p], header="Summary:", stop=("\n",)) for p in parts]
        )
        levels = [len(level)]
        while len(level) > 1:
            run.stage(f"reduce level {len(levels)}: {len(level)} summaries")
            groups = [level[i : i + fan_in] for i in range(0, len(level), fan_in)]
            level = await run.ask(
                reducer,
                *[
                    run.turn(
                        [reduce, *g],
                        header="Summary:",
                        repair=run.decision_repair,
                        final=len(groups) == 1,  # the last level's one summary: the answer
                    )
                    for g in groups
                ],
            )
            levels.append(len(level))
        return run.result(level[0].text.strip(), dict(chunks=len(chunks), levels=levels))
