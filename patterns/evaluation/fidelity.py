"""Fidelity: how much choreography changes what a workflow's model says.

The Prompt Choreography paper (sections 3.2-3.4, 4.2) measures it on equal
tokens: sample a run of the workflow in the baseline (the semantics users know:
every call re-reads its parents' text) at temperature 1, then replay the same
workflow choreographed with every decode forced to the baseline's tokens, and
compare how each mode scores those tokens. `measure` does that per input:

- log-loss per decoded token under the baseline and under each replay; the gap
  (replay minus baseline, nats/token) is what choreography costs, and what
  distillation (`corps.patterns.evaluation.distill`) trains away;
- top-1 agreement: the share of positions where both modes' argmax is the same;
- the first greedy divergence: the first position of a turn where the argmaxes
  differ (how soon a greedy run would have taken another path).

A replay is any engine: choreographed, choreographed with an adapter or a repair
policy (`corps.engine.repair`), or the baseline with an adapter (the adapter's
effect on the model's normal behaviour). Each replay runs over every input in
turn, alone, after one untimed replay of the first input (whichever replay ran
first would otherwise also pay the process's warm-up), so its wall time is its
own; with its turns' TTFT and the context tokens it recomputed, a set of replays
is a curve of fidelity against cost.
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from corps.patterns.cluster.each import each
from corps.patterns.evaluation.scoring import split_line
from corps.patterns.registry import get, run_pattern
from corps.patterns.replay import Replay, TurnScores
from corps.patterns.result import PatternResult

#: How the baseline is sampled: the model's own distribution (the paper: temperature 1,
#: free text). A constraint would mask that distribution, and log-probabilities are the
#: model's unmasked ones: an adapter trained on constrained samples learns the mask and
#: "beats" the baseline on its own tokens (measured: a gap of -0.08 nats/token on
#: multi-QA). A line or --set that gives `constrained` keeps it.
SAMPLING = dict(temperature=1.0, top_p=1.0, constrained=False)


def sampling_params(pattern: str, params: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """An input line's pattern parameters (references such as "answer" and "id" left
    out) with the baseline's sampling settings and `seed`, for the settings `pattern`
    takes."""
    takes = inspect.signature(get(pattern)).parameters
    given = split_line(params)[0]
    out = {**given, "seed": seed}
    out.update({k: v for k, v in SAMPLING.items() if k in takes})
    if "constrained" in given:
        out["constrained"] = given["constrained"]
    return out


async def sample(rt, pattern: str, params: Mapping[str, Any]) -> tuple[Replay, PatternResult]:
    """A run of `pattern` in `rt` that records every turn's tokens and scores."""
    replay = Replay(logprobs=True)
    with replay.active():
        result = await run_pattern(rt, pattern, params)
    return replay, result


async def replay(
    rt, pattern: str, params: Mapping[str, Any], recorded: Replay
) -> tuple[Replay, PatternResult]:
    """The same run in `rt`, every turn forced to `recorded`'s tokens and scored."""
    forced = recorded.forcing(logprobs=True)
    with forced.active():
        result = await run_pattern(rt, pattern, params)
    return forced, result


@dataclass(frozen=True)
class Pair:
    """One input's baseline run and a replay of it: the scores of each turn."""

    index: int
    baseline: dict[int, TurnScores]
    replayed: dict[int, TurnScores]
    # the workflow's tokens encoded (every call: prefills, decodes, repairs), the
    # baseline's sampling and the replay's: work for work, as the tokens are the same
    base_encoded: int = 0
    replay_encoded: int = 0

    @property
    def of_baseline(self) -> float:
        """The replay's whole work as a share of the baseline's (1.0: as much)."""
        return self.replay_encoded / self.base_encoded if self.base_encoded else math.nan


@dataclass
class Row:
    """Fidelity of one group of turns (a role, or all): sums, then `finish`ed."""

    role: str
    turns: int = 0
    tokens: int = 0
    baseline_nll: float = 0.0  # summed over tokens
    replay_nll: float = 0.0
    agree: int = 0  # positions whose argmax is the same in both modes
    diverged: int = 0  # turns with at least one such position that differs
    first: list[int] = field(default_factory=list)  # each diverged turn's first position
    ttfts: list[float] = field(default_factory=list)  # the replay's turns' TTFT (s)
    base_ttfts: list[float] = field(default_factory=list)  # the baseline's (its sampling)
    reused: int = 0  # context tokens the replay's turns read as encoded
    repaired: int = 0  # context tokens they recomputed (a repair)
    base_work: int = 0  # context tokens the baseline encoded for the same turns
    calls_over: int = 0  # turns whose recompute exceeded the baseline's context work
    worst_call: float = 0.0  # the largest turn's recompute / baseline context work

    def add(self, base: TurnScores, other: TurnScores) -> None:
        n = min(len(base.logprobs), len(other.logprobs))
        if other.ttft_s is not None:
            self.ttfts.append(other.ttft_s)
        if base.ttft_s is not None:
            self.base_ttfts.append(base.ttft_s)
        self.reused += other.reused
        self.repaired += other.repaired
        self.base_work += base.context_encoded
        if other.repaired:
            share = other.repaired / base.context_encoded if base.context_encoded else math.inf
            self.worst_call = max(self.worst_call, share)
            self.calls_over += share > 1.0
        self.turns += 1
        self.tokens += n
        self.baseline_nll -= sum(base.logprobs[:n])
        self.replay_nll -= sum(other.logprobs[:n])
        same = [a == b for a, b in zip(base.greedy[:n], other.greedy[:n], strict=True)]
        self.agree += sum(same)
        if not all(same):
            self.diverged += 1
            self.first.append(same.index(False))

    @property
    def baseline_loss(self) -> float:
        """Mean log-loss per token under the baseline (nats)."""
        return self.baseline_nll / self.tokens if self.tokens else math.nan

    @property
    def replay_loss(self) -> float:
        return self.replay_nll / self.tokens if self.tokens else math.nan

    @property
    def gap(self) -> float:
        """Replay minus baseline log-loss per token (nats): what the replay loses."""
        return self.replay_loss - self.baseline_loss

    @property
    def agreement(self) -> float:
        return self.agree / self.tokens if self.tokens else math.nan

    @property
    def ttft(self) -> float | None:
        """Mean TTFT of the replay's turns (seconds)."""
        return sum(self.ttfts) / len(self.ttfts) if self.ttfts else None

    @property
    def baseline_ttft(self) -> float | None:
        """Mean TTFT of the same turns when the baseline sampled them (seconds)."""
        return sum(self.base_ttfts) / len(self.base_ttfts) if self.base_ttfts else None

    @property
    def recomputed(self) -> float:
        """Share of the replay's reused context tokens it recomputed instead."""
        total = self.reused + self.repaired
        return self.repaired / total if total else 0.0

    @property
    def of_baseline(self) -> float:
        """Tokens the replay recomputed as a share of the context tokens the baseline
        encoded for the same turns (its own work: 1.0 saves nothing)."""
        return self.repaired / self.base_work if self.base_work else math.nan

    @property
    def first_divergence(self) -> float | None:
        """Mean position of the first differing argmax, over the turns that diverge."""
        return sum(self.first) / len(self.first) if self.first else None

    def as_dict(self) -> dict[str, Any]:
        return dict(
            role=self.role, turns=self.turns, tokens=self.tokens,
            baseline_loss=self.baseline_loss, replay_loss=self.replay_loss, gap=self.gap,
            agreement=self.agreement, diverged_turns=self.diverged,
            first_divergence=self.first_divergence, ttft_s=self.ttft,
            baseline_ttft_s=self.baseline_ttft,
            tokens_reused=self.reused, tokens_repaired=self.repaired, recomputed=self.recomputed,
            baseline_context_tokens=self.base_work, of_baseline_work=self.of_baseline,
            calls_over_baseline_work=self.calls_over,
            worst_call_of_baseline_work=_finite(self.worst_call),
        )  # fmt: skip


def table(pairs: Sequence[Pair]) -> list[Row]:
    """One row per role (in order of appearance) and a last row "all"."""
    rows: dict[str, Row] = {}
    total = Row("all")
    for p in pairs:
        for index, base in sorted(p.baseline.items()):
            other = p.replayed.get(index)
            if other is None:
                continue
            rows.setdefault(base.role, Row(base.role)).add(base, other)
            total.add(base, other)
    return [*rows.values(), total]


@dataclass
class Report:
    """Per replay label (e.g. "choreographed"), the pairs it gave."""

    pattern: str
    pairs: dict[str, list[Pair]]
    failed: list[tuple[int, str]] = field(default_factory=list)  # (input index, why)
    # seconds each replay (and "baseline", the sampling) took over all the inputs
    wall: dict[str, float] = field(default_factory=dict)

    def tables(self) -> dict[str, list[Row]]:
        return {label: table(p) for label, p in self.pairs.items()}

    def work(self, label: str) -> tuple[float, int]:
        """The replay's tokens encoded over every workflow as a share of the
        baseline's, and how many workflows encoded more than the baseline's."""
        pairs = self.pairs[label]
        base = sum(p.base_encoded for p in pairs)
        share = sum(p.replay_encoded for p in pairs) / base if base else math.nan
        return share, sum(p.replay_encoded > p.base_encoded for p in pairs)

    def as_dict(self) -> dict[str, Any]:
        return dict(
            pattern=self.pattern,
            inputs=len(next(iter(self.pairs.values()), [])),
            failed=[dict(index=i, error=e) for i, e in self.failed],
            replays={k: [r.as_dict() for r in rows] for k, rows in self.tables().items()},
            workflows={
                k: [
                    dict(
                        index=p.index,
                        baseline_encoded=p.base_encoded,
                        replay_encoded=p.replay_encoded,
                    )
                    for p in pairs
                ]
                for k, pairs in self.pairs.items()
            },
            wall_s=self.wall,
        )


async def warm(
    rt, pattern: str, params: Sequence[Mapping[str, Any]], recorded: Mapping[int, Replay]
) -> None:
    """Replay the first recorded input once in `rt`, untimed and unscored, so a
    replay's times do not include what the first one to run pays alone (the
    allocator's and the kernels' first calls); a failure here is the timed pass's
    to report."""

    async def one(i: int) -> None:
        await replay(rt, pattern, params[i], recorded[i])

    if recorded:
        await each([min(recorded)], one, concurrency=1)
        await rt.engine.reset_prefix_cache()  # the timed pass as cold as the warm-up was


async def measure(
    base_rt,
    replays: Mapping[str, Any],
    pattern: str,
    inputs: Sequence[Mapping[str, Any]],
    seeds: Sequence[int],
    *,
    concurrency: int = 4,
    on_done: Callable[[], None] | None = None,
) -> Report:
    """Sample input i at seed i in `base_rt` (a baseline runtime), then replay every
    input forced in each of `replays` (label -> runtime), one replay after another
    (the sampling and each replay warmed first on input 0, untimed), and pair the
    scores of every turn. An input that fails
    anywhere is left out of every replay's pairs (and listed in `failed`). `on_done`
    runs once per input sampled and once per input replayed in each replay (not for
    the warm-up)."""
    report = Report(pattern, {label: [] for label in replays})
    params = [sampling_params(pattern, inputs[i], seeds[i]) for i in range(len(inputs))]
    recorded: dict[int, Replay] = {}

    base_encoded: dict[int, int] = {}

    async def sample_one(i: int) -> None:
        recorded[i], result = await sample(base_rt, pattern, params[i])
        base_encoded[i] = result.tokens_encoded

    async def warm_sample(i: int) -> None:
        await sample(base_rt, pattern, params[i])

    if inputs:  # untimed, as each replay is (`warm`), and forgotten by the prefix cache
        await each([0], warm_sample, concurrency=1)
        await base_rt.engine.reset_prefix_cache()
    t0 = time.perf_counter()
    failed = dict(await each(range(len(inputs)), sample_one, concurrency=concurrency,
                             on_done=on_done))  # fmt: skip
    report.wall["baseline"] = time.perf_counter() - t0
    got: dict[str, dict[int, Pair]] = {label: {} for label in replays}
    for label, rt in replays.items():

        async def replay_one(i: int, rt=rt, label=label) -> None:
            forced, result = await replay(rt, pattern, params[i], recorded[i])
            got[label][i] = Pair(i, recorded[i].scores, forced.scores, base_encoded[i],
                                 result.tokens_encoded)  # fmt: skip

        await warm(rt, pattern, params, recorded)
        t0 = time.perf_counter()
        failed.update(await each(sorted(recorded), replay_one, concurrency=concurrency,
                                 on_done=on_done))  # fmt: skip
        report.wall[label] = time.perf_counter() - t0
    for label, pairs in got.items():  # all replays of an input, or none of them
        report.pairs[label] = [p for i, p in sorted(pairs.items()) if i not in failed]
    report.failed = sorted(failed.items())
    return report


def _finite(x: float) -> float | None:
    """x, or None where it is infinite (JSON has no infinity)."""
    return None if math.isinf(x) else x
