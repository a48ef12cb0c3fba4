"""`corps bench patterns`: every built-in pattern in each mode with its defaults, side by side.

By default each configuration makes its own decisions, as `corps run` does:
what a user gets from the defaults, so a default that costs more than it saves
shows. With `equal_work` every other configuration decodes the baseline's
tokens (a `Replay`), so each makes the same calls and the tokens encoded compare
work for work, per workflow and per call ("over": the turns that encoded more
than the baseline's same turn). For each pattern, decode budget (`max_tokens`)
and seed, the configurations run one after the other (interleaved; the baseline
first on equal work), each on a fresh engine
in this process, as `corps run` opens one: no run finds another's prefixes.
Per cell: calls, tokens encoded (of them recomputed by repairs, and cut from
repairs by the baseline bound), mean time to first token, wall time; and
choreographed / baseline for tokens encoded, for the same less the tokens
each sampled (the modes' replies differ in length: choreography is not exact),
and for wall time.

Configurations: "baseline"; "choreographed" (its defaults: the decision steps'
repair, bounded by the baseline's work); "unrepaired" (choreographed without the
decision repair); "unbounded" (choreographed, the bound lifted).
"""

from __future__ import annotations

import statistics
from typing import Any

from pydantic import BaseModel
from rich.table import Table

#: Engine settings of each configuration (`Engine.open` keywords besides the model).
CONFIGS: dict[str, dict[str, Any]] = {
    "baseline": dict(mode="baseline"),
    "choreographed": dict(mode="choreographed"),
    "unrepaired": dict(mode="choreographed", decision_repair="none"),
    "unbounded": dict(mode="choreographed", repair_bound=False),
}


class Run(BaseModel):
    """One configuration's figures for one run of one pattern."""

    pattern: str
    max_tokens: int
    seed: int
    config: str
    calls: int
    encoded: int  # tokens run through the model
    generated: int  # of them, sampled (the rest: prompts, context, repairs)
    repaired: int  # of them, rewired context recomputed by repairs
    cut: int  # tokens repairs chose that the baseline bound left out
    ttft_s: float | None  # mean over its decodes
    wall_s: float
    # equal work: its turns that encoded more than the baseline's same turn (None: not
    # compared, its own decisions)
    over: int | None = None


class Report(BaseModel):
    model: str
    configs: list[str]
    runs: list[Run]
    equal_work: bool = False

    def cell(self, pattern: str, max_tokens: int, config: str) -> list[Run]:
        key = (pattern, max_tokens, config)
        return [r for r in self.runs if (r.pattern, r.max_tokens, r.config) == key]


def run_of(result, pattern: str, max_tokens: int, seed: int, config: str) -> Run:
    msgs = [h for h in result.messages if h is not None]
    ttfts = [h.ttft for h in msgs if h.ttft is not None]
    return Run(
        pattern=pattern,
        max_tokens=max_tokens,
        seed=seed,
        config=config,
        calls=len(msgs),
        encoded=result.tokens_encoded,
        generated=sum(len(h.generated) for h in msgs if h.ttft is not None),
        repaired=sum(h.tokens_repaired for h in msgs),
        cut=sum(h.tokens_repair_cut for h in msgs),
        ttft_s=statistics.fmean(ttfts) if ttfts else None,
        wall_s=result.wall_s,
    )


async def measure(
    patterns: list[str],
    budgets: list[int],
    *,
    model: str,
    configs: list[str],
    seeds: int = 1,
    dtype: str = "float32",
    equal_work: bool = False,
) -> Report:
    """Each pattern at each budget and seed in every configuration, each run on an
    engine of its own (as `corps run`: no prefix cached by an earlier run).
    `equal_work`: the baseline runs first and the others decode its tokens."""
    from corps.patterns.replay import Replay

    if equal_work and "baseline" not in configs:
        raise ValueError("equal work forces the baseline's tokens: include baseline")
    order = sorted(configs, key=lambda c: c != "baseline") if equal_work else configs
    runs: list[Run] = []
    for pattern in patterns:
        for budget in budgets:
            for seed in range(seeds):
                base = Replay(figures=True)
                for name in order:
                    replay = base if name == "baseline" else base.forcing(figures=True)
                    run = await _one(pattern, budget, seed, name, model, dtype,
                                     replay if equal_work else None)  # fmt: skip
                    if equal_work and name != "baseline":
                        run.over = over(base, replay)
                    runs.append(run)
    return Report(model=model, configs=configs, runs=runs, equal_work=equal_work)


async def _one(
    pattern: str, budget: int, seed: int, name: str, model: str, dtype: str, replay: Any
) -> Run:
    """One configuration's run on an engine of its own (under `replay`, if any)."""
    from contextlib import nullcontext

    from corps.agents import Runtime
    from corps.engine import Engine
    from corps.patterns.registry import run_pattern

    async with (
        Engine.open(model, dtype=dtype, **CONFIGS[name]) as engine,
        Runtime(engine) as rt,
    ):
        with replay.active() if replay is not None else nullcontext():
            result = await run_pattern(rt, pattern, dict(max_tokens=budget, seed=seed))
    return run_of(result, pattern, budget, seed, name)


def over(base: Any, replay: Any) -> int:
    """Turns of `replay` that encoded more tokens than the same turn of `base`."""
    return sum(
        1
        for i, t in replay.scores.items()
        if i in base.scores and t.encoded > base.scores[i].encoded
    )


def _mean(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.fmean(kept) if kept else None


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def table(report: Report) -> Table:
    """One row per pattern and budget; per configuration calls, tokens encoded
    (repaired / cut), TTFT and wall; then choreographed / baseline."""
    how = "on the baseline's tokens" if report.equal_work else "each its own decisions"
    t = Table(title=f"each pattern with its defaults ({report.model}; {how}; means over seeds)")
    t.add_column("pattern")
    t.add_column("max tok", justify="right")
    for name in report.configs:
        over_col = "; over" if report.equal_work and name != "baseline" else ""
        t.add_column(f"{name}\ncalls / encoded (rep / cut{over_col})", justify="right")
        t.add_column(f"{name}\nTTFT / wall ms", justify="right")
    both = "baseline" in report.configs and "choreographed" in report.configs
    if both:
        t.add_column("chor / base\nencoded", justify="right")
        t.add_column("chor / base\nnot sampled", justify="right")
        t.add_column("chor / base\nwall", justify="right")
    cells = sorted({(r.pattern, r.max_tokens) for r in report.runs},
                   key=lambda c: ([r.pattern for r in report.runs].index(c[0]), c[1]))  # fmt: skip
    for pattern, budget in cells:
        row = [pattern.replace("_", "-"), str(budget)]
        means = {}
        for name in report.configs:
            runs = report.cell(pattern, budget, name)
            m = {k: _mean([getattr(r, k) for r in runs])
                 for k in ("calls", "encoded", "generated", "repaired", "cut", "ttft_s",
                           "wall_s")}  # fmt: skip
            means[name] = m
            overs = [r.over for r in runs if r.over is not None]
            extra = f"; {sum(overs) / len(overs):.0f} over" if overs else ""
            row.append(f"{m['calls']:.0f} / {m['encoded']:.0f} ({m['repaired']:.0f} / "
                       f"{m['cut']:.0f}{extra})")  # fmt: skip
            row.append(f"{_ms(m['ttft_s'])} / {_ms(m['wall_s'])}")
        if both:
            c, b = means["choreographed"], means["baseline"]
            row.append(f"{c['encoded'] / b['encoded']:.2f}x" if b["encoded"] else "-")
            prompt = b["encoded"] - b["generated"]
            row.append(f"{(c['encoded'] - c['generated']) / prompt:.2f}x" if prompt else "-")
            row.append(f"{c['wall_s'] / b['wall_s']:.2f}x" if b["wall_s"] else "-")
        t.add_row(*row)
    return t
