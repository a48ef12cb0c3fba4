"""`corps bench workflow`: one workflow, three implementations, equal work, side by side.

Measured the way the Prompt Choreography paper does (section 4.3): the same
inputs run in each implementation in one process, interleaved run by run
(baseline, choreographed, hf, baseline, ...), on equal work: the baseline's
decoded tokens are recorded and teacher-forced on the others (one decode step
per token, timed as normal decoding), so every implementation decodes the same
tokens. Reported per implementation: mean time to first token per call,
end-to-end wall time and tokens prefilled / reused / decoded; and the ratios
baseline/choreographed and hf/choreographed (ratio of means over runs) with
bootstrap 95% confidence intervals.

Also reported: the end-to-end *ceiling*, the baseline's wall time over its time
outside encoding steps. Both implementations decode the same tokens through the
same batched decode steps, so choreography can only save the baseline's
encoding steps; were its own encoding free, it would reach exactly this ratio.
A target above the ceiling cannot be met on that machine by encoding less.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any

from pydantic import BaseModel

from corps.engine.config import DEFAULT_DTYPE
from corps.patterns.replay import Replay
from corps.patterns.result import PatternResult

#: The order within a run: the baseline records the tokens the others replay.
IMPLS = ("baseline", "choreographed", "hf")
METRICS = ("ttft_s", "wall_s")


class Sample(BaseModel):
    """One implementation's figures for one run."""

    ttft_s: float  # mean time to first token per decode call
    wall_s: float
    calls: int
    prefilled: int  # tokens run through the model that were not sampled
    reused: int  # cached tokens attended to without encoding them
    decoded: int  # sampled (or teacher-forced) tokens
    encode_s: float = 0.0  # wall time of the engine's steps that encoded a prompt chunk or a footer
    tokens: list[list[int]]  # each decode's tokens, in the run's order (equal-work check)


class Ratio(BaseModel):
    mean: float
    low: float  # bootstrap 95% interval
    high: float


class Report(BaseModel):
    pattern: str
    params: dict[str, Any]
    runs: list[dict[str, Sample]]
    ratios: dict[str, dict[str, Ratio]]  # "baseline/choreographed" -> metric -> ratio
    equal_work: bool
    ceiling: float  # end to end baseline/choreographed if choreography encoded nothing

    def mean(self, impl: str, field: str) -> float:
        return statistics.fmean(getattr(r[impl], field) for r in self.runs)


def sample_of(result: PatternResult, encode_s: float = 0.0) -> Sample:
    decodes = [h for h in result.messages if h is not None and h.ttft is not None]
    tokens = [h.generated for h in decodes]
    decoded = sum(len(t) for t in tokens)
    # generated tokens run back through the model: all in choreography (a message is
    # kept encoded); the baseline and hf never run a turn's last token (they re-encode
    # its text where it is read)
    fed_back = decoded - (0 if result.mode == "choreographed" else len(decodes))
    return Sample(
        ttft_s=statistics.fmean(h.ttft for h in decodes) if decodes else 0.0,
        wall_s=result.wall_s,
        calls=len(decodes),
        prefilled=result.tokens_encoded - fed_back,
        reused=result.tokens_reused,
        decoded=decoded,
        encode_s=encode_s,
        tokens=tokens,
    )


async def run_once(runtimes: dict[str, Any], pattern: str, params: dict[str, Any]):
    """One run in each implementation, baseline first; returns {impl: Sample}."""
    from corps.patterns.registry import run_pattern

    replay, out = Replay(), {}
    for impl, rt in runtimes.items():
        encode0 = rt.engine.stats().encode_step_s
        with (replay if impl == "baseline" else replay.forcing()).active():
            result = await run_pattern(rt, pattern, params)
        out[impl] = sample_of(result, rt.engine.stats().encode_step_s - encode0)
    return out


def bootstrap(num: list[float], den: list[float], n: int = 2000, seed: int = 0) -> Ratio:
    """Ratio of means with a percentile bootstrap over runs (paired resampling)."""
    rng, k = random.Random(seed), len(num)
    ratio = statistics.fmean(num) / statistics.fmean(den)
    draws = []
    for _ in range(n if k > 1 else 0):
        idx = [rng.randrange(k) for _ in range(k)]
        draws.append(sum(num[i] for i in idx) / sum(den[i] for i in idx))
    draws.sort()
    if not draws:
        return Ratio(mean=ratio, low=ratio, high=ratio)
    return Ratio(mean=ratio, low=draws[int(0.025 * n)], high=draws[int(0.975 * n) - 1])


def ceiling(runs: list[dict[str, Sample]]) -> float:
    """The baseline's mean wall time over its mean time outside encoding steps."""
    wall = statistics.fmean(r["baseline"].wall_s for r in runs)
    encode = statistics.fmean(r["baseline"].encode_s for r in runs)
    return wall / (wall - encode) if wall > encode else float("inf")


def ratios(runs: list[dict[str, Sample]]) -> dict[str, dict[str, Ratio]]:
    out = {}
    for impl in [i for i in runs[0] if i != "choreographed"]:
        out[f"{impl}/choreographed"] = {
            m: bootstrap(
                [getattr(r[impl], m) for r in runs], [getattr(r["choreographed"], m) for r in runs]
            )
            for m in METRICS
        }
    return out


async def measure(
    pattern: str,
    params: dict[str, Any],
    *,
    model: str,
    impls: tuple[str, ...] = IMPLS,
    runs: int = 3,
    warmup: int = 1,
    dtype: str = DEFAULT_DTYPE,
    questions: list[str] | None = None,
    device: str = "cpu",
    repair: str = "none",
    engine_kw: dict[str, Any] | None = None,
) -> Report:
    """Open one engine per implementation, warm up, then interleave `runs` runs.

    With `questions`, run r asks questions[r % len] unless params fix `question`.
    `repair`: the choreographed engine's repair policy (`corps.engine.repair`).
    `engine_kw`: further `Engine.open` settings of every engine (e.g. a
    `memory_budget`, so that two engines of a large model fit on one GPU).
    """
    from corps.agents import Runtime
    from corps.engine import Engine

    order = [i for i in IMPLS if i in impls]
    if "baseline" not in order or "choreographed" not in order:
        raise ValueError("impls must include baseline and choreographed")
    async with AsyncExitStack() as stack:
        runtimes = {}
        for impl in order:
            extra = dict(engine_kw or {})
            if impl == "choreographed":
                extra["repair"] = repair
            engine = await stack.enter_async_context(
                Engine.open(model, mode=impl, dtype=dtype, device=device, **extra)
            )
            runtimes[impl] = await stack.enter_async_context(Runtime(engine))
        samples = []
        for r in range(warmup + runs):
            p = dict(params)
            if questions:
                p.setdefault("question", questions[r % len(questions)])
            one = await run_once(runtimes, pattern, p)
            if r >= warmup:
                samples.append(one)
    equal = all(len({str(s.tokens) for s in run.values()}) == 1 for run in samples)
    return Report(
        pattern=pattern,
        params=params,
        runs=samples,
        ratios=ratios(samples),
        equal_work=equal,
        ceiling=ceiling(samples),
    )


# ---- rendering ----


def table(report: Report):
    from rich.table import Table

    impls = list(report.runs[0])
    t = Table(
        title=f"{report.pattern}: {len(report.runs)} runs, equal work "
        f"{'yes' if report.equal_work else 'NO'}"
    )
    t.add_column("")
    for impl in impls:
        t.add_column(impl, justify="right")
    rows = [
        ("mean TTFT / call", "ttft_s", lambda v: f"{v * 1000:.0f} ms"),
        ("end to end", "wall_s", lambda v: f"{v:.2f} s"),
        ("  in encoding steps", "encode_s", lambda v: f"{v:.2f} s"),
        ("calls", "calls", lambda v: f"{v:.0f}"),
        ("tokens prefilled", "prefilled", lambda v: f"{v:.0f}"),
        ("tokens reused", "reused", lambda v: f"{v:.0f}"),
        ("tokens decoded", "decoded", lambda v: f"{v:.0f}"),
    ]
    for label, field, fmt in rows:
        t.add_row(label, *[fmt(report.mean(i, field)) for i in impls])
    return t


def ratio_table(report: Report):
    """Speedups of choreographed: other / choreographed, ratio of means, [95% interval]."""
    from rich.table import Table

    t = Table(
        title=f"{report.pattern}: speedup of choreographed (95% bootstrap interval)",
        caption=f"end-to-end ceiling {report.ceiling:.2f}x: baseline/choreographed if "
        "choreography encoded nothing (the baseline's wall time over its time outside "
        "encoding steps)",
    )
    for col in ("ratio", "mean TTFT / call", "end to end"):
        t.add_column(col, justify="right")
    for name, by in report.ratios.items():
        cells = [f"{by[m].mean:.2f}x [{by[m].low:.2f}, {by[m].high:.2f}]" for m in METRICS]
        t.add_row(name, *cells)
    return t


def plot(reports: list[Report], path: str) -> None:
    """Bar chart of the ratios with their 95% intervals (needs the `plot` extra)."""
    from corps.bench.plotting import pyplot

    plt = pyplot()
    bars = [
        (f"{rep.pattern}\n{name} {m}", by[m])
        for rep in reports
        for name, by in rep.ratios.items()
        for m in ("ttft_s", "wall_s")
    ]
    fig, ax = plt.subplots(figsize=(max(6, len(bars) * 1.1), 4))
    means = [r.mean for _, r in bars]
    errs = [[r.mean - r.low for _, r in bars], [r.high - r.mean for _, r in bars]]
    ax.bar(range(len(bars)), means, yerr=errs, capsize=4)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks(range(len(bars)), [b for b, _ in bars], fontsize=7)
    ax.set_ylabel("speedup of choreographed (other / choreographed)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# ---- the paper's settings and the tree-of-thoughts sweep ----

#: Prompt Choreography table 5: debate 3 rounds, ToT 8 branches x 4 voters, MADpar 3 x 3.
PAPER = (
    ("debate", {"rounds": 3}),
    ("tree_of_thoughts", {"branches": 8, "voters": 4}),
    ("parallel_debate", {"agents": 3, "rounds": 3}),
)


#: The sweep's heat maps: what each shows of a cell's report.
SWEEP_MAPS = (
    ("end to end", lambda rep: rep.ratios["baseline/choreographed"]["wall_s"].mean),
    ("TTFT", lambda rep: rep.ratios["baseline/choreographed"]["ttft_s"].mean),
    ("end-to-end ceiling (if choreography encoded nothing)", lambda rep: rep.ceiling),
)


def sweep_table(
    cells: dict[tuple[int, int], Report],
    sizes: list[int],
    value: Callable[[Report], float],
    title: str,
):
    """A heat map (rows: branches, columns: voters) of `value` of each cell's report."""
    from rich.table import Table

    t = Table(title=title)
    t.add_column("branches \\ voters", justify="right")
    for v in sizes:
        t.add_column(str(v), justify="right")
    values = [value(c) for c in cells.values()]
    top = max(values) if values else 1.0
    for b in sizes:
        row = []
        for v in sizes:
            r = value(cells[(b, v)])
            shade = int(40 + 180 * (r - 1) / (top - 1)) if top > 1 and r > 1 else 40
            row.append(f"[on rgb(0,{min(shade, 220)},0)]{r:.2f}x[/]")
        t.add_row(str(b), *row)
    return t
