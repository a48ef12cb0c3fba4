"""A pattern's task score on a set of inputs, per configuration, paired by input.

`scores` runs the pattern on every input line (its references split off, seed i
for line i, the pattern's own sampling settings) and scores each result with the
pattern's scorer (`corps.patterns.evaluation.scoring`); a run that fails scores None and
says why. It also keeps what the runs cost: their TTFT, the context their calls
reused, encoded and recomputed (a repair; the engine's fidelity audits' shadows
apart), and the wall time of the whole pass, timed
after one untimed run of the first line (the warm-up a first configuration
would otherwise pay alone). `compare` pairs two configurations' scores on the
inputs both scored.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from corps.patterns.cluster.each import each
from corps.patterns.evaluation.scoring import Score, scorer, split_line
from corps.patterns.evaluation.significance import Comparison
from corps.patterns.evaluation.significance import compare as paired
from corps.patterns.registry import run_pattern
from corps.patterns.result import PatternResult


@dataclass
class Scores:
    label: str
    scores: list[Score | None]
    errors: dict[int, str] = field(default_factory=dict)
    ttfts: list[float] = field(default_factory=list)  # each run's mean TTFT (s)
    reused: int = 0  # context tokens the runs' calls read as encoded
    repaired: int = 0  # context tokens they recomputed instead (a repair)
    encoded: int = 0  # tokens the runs' calls ran through the model (repairs included)
    generated: int = 0  # tokens their decodes generated (encoded in every mode)
    audit_tokens: int = 0  # tokens the engine's fidelity audits encoded during the pass
    wall_s: float = 0.0  # the pass over every line (after the warm-up), its audits included
    # each input's tokens encoded (None: it failed); its own decisions, so compared
    # with another configuration's only as "for the same input", not token for token
    per_input: list[int | None] = field(default_factory=list)

    @property
    def mean(self) -> float | None:
        got = [float(s) for s in self.scores if s is not None]
        return sum(got) / len(got) if got else None

    @property
    def ttft(self) -> float | None:
        """Mean over the runs of each run's mean TTFT (s)."""
        return sum(self.ttfts) / len(self.ttfts) if self.ttfts else None

    @property
    def recomputed(self) -> float:
        """Share of the context tokens the calls recomputed instead of reusing."""
        context = self.reused + self.repaired
        return self.repaired / context if context else 0.0

    @property
    def context_encoded(self) -> int:
        """Context (prompt) tokens the calls encoded: what the baseline's own work is
        (its prefix cache's hits are not encoded, so not counted)."""
        return self.encoded - self.generated

    def over(self, baseline: Scores) -> tuple[int, int]:
        """(inputs where this configuration's run encoded more tokens in all than the
        baseline's run of the same input, inputs both ran)."""
        both = [(a, b) for a, b in zip(self.per_input, baseline.per_input, strict=True)
                if a is not None and b is not None]  # fmt: skip
        return sum(a > b for a, b in both), len(both)

    def share_of(self, baseline: Scores) -> float:
        """The tokens this configuration recomputed (its repairs, and its audits'
        shadows) as a share of the context tokens `baseline` encoded for the same
        inputs: 1.0 saves nothing."""
        work = baseline.context_encoded
        return (self.repaired + self.audit_tokens) / work if work else math.nan


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
    out = Scores(label, [None] * len(lines), per_input=[None] * len(lines))

    async def run(i: int) -> PatternResult:
        params, _ = split_line(lines[i])
        return await run_pattern(rt, pattern, {**params, "seed": seeds[i]})

    async def one(i: int) -> None:
        result = await run(i)
        out.scores[i] = score(result, lines[i])
        if result.mean_ttft_s is not None and not math.isnan(result.mean_ttft_s):
            out.ttfts.append(result.mean_ttft_s)
        out.repaired += sum(h.tokens_repaired for h in result.messages)
        out.reused += result.tokens_reused
        out.encoded += result.tokens_encoded
        out.per_input[i] = result.tokens_encoded
        out.generated += sum(len(h.generated) for h in result.messages)

    async def warm(i: int) -> None:
        await run(i)

    if lines:  # a failure here is the timed pass's to report
        await each([0], warm, concurrency=1)
        await rt.engine.reset_prefix_cache()  # the pass as cold as the warm-up was
    # an input that fails scores None and says why; the others go on
    engine = rt.engine
    audited = engine.stats().audit_tokens
    t0 = time.perf_counter()
    out.errors = await each(range(len(lines)), one, concurrency=concurrency, on_done=on_done)
    await engine.fidelity_report()  # the pass's audits are its cost too
    out.wall_s = time.perf_counter() - t0
    out.audit_tokens = engine.stats().audit_tokens - audited
    return out


def compare(a: Scores, b: Scores) -> Comparison:
    """B against A on the inputs both scored (McNemar or paired bootstrap)."""
    both = [i for i, (x, y) in enumerate(zip(a.scores, b.scores, strict=True))
            if x is not None and y is not None]  # fmt: skip
    return paired([a.scores[i] for i in both], [b.scores[i] for i in both])
