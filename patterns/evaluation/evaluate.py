"""A pattern's task score on a set of inputs, per configuration, paired by input.

`scores` runs the pattern on every input line (its references split off, seed i
for line i, the pattern's own sampling settings) and scores each result with the
pattern's scorer (`corps.patterns.evaluation.scoring`); a run that fails scores None and
says why. `compare` pairs two configurations' scores on the inputs both scored.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from corps.patterns.cluster.each import each
from corps.patterns.evaluation.scoring import Score, scorer, split_line
from corps.patterns.evaluation.significance import Comparison
from corps.patterns.evaluation.significance import compare as paired
from corps.patterns.registry import run_pattern


@dataclass
class Scores:
    label: str
    scores: list[Score | None]
    errors: dict[int, str] = field(default_factory=dict)

    @property
    def mean(self) -> float | None:
        got = [float(s) for s in self.scores if s is not None]
        return sum(got) / len(got) if got else None


async def scores(
    rt,
    label: str,
    pattern: str,
    lines: Sequence[Mapping[str, Any]],
    seeds: Sequence[int],
    *,
    concurrency: int = 4,
    on_done: Callable[[], None] | None = None,
) -> Scores:
    score = scorer(pattern)
    out = Scores(label, [None] * len(lines))

    async def one(i: int) -> None:
        params, _ = split_line(lines[i])
        result = await run_pattern(rt, pattern, {**params, "seed": seeds[i]})
        out.scores[i] = score(result, lines[i])

    # an input that fails scores None and says why; the others go on
    out.errors = await each(range(len(lines)), one, concurrency=concurrency, on_done=on_done)
    return out


def compare(a: Scores, b: Scores) -> Comparison:
    """B against A on the inputs both scored (McNemar or paired bootstrap)."""
    both = [i for i, (x, y) in enumerate(zip(a.scores, b.scores, strict=True))
            if x is not None and y is not None]  # fmt: skip
    return paired([a.scores[i] for i in both], [b.scores[i] for i in both])
