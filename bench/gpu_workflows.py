"""`corps bench gpu`'s sections over whole workflows: choreographed against the baseline
on equal work, each pattern's per-phase account, every pattern once per mode."""

from __future__ import annotations

import math
from pathlib import Path

from rich.console import Console

from corps.bench.gpu_figures import WORKFLOWS, Figure, Settings, release, timed


async def workflow_figures(s: Settings) -> list[Figure]:
    from corps.bench.workflow import measure
    from corps.patterns.samples import MATH_PROBLEMS

    out = []
    for name in s.workflows:
        pattern, params = WORKFLOWS[name]
        params = {**params, "max_tokens": s.workflow_tokens}
        report = await measure(
            pattern, params, model=s.model, impls=("baseline", "choreographed"),
            runs=s.runs, dtype=s.dtype, device=s.device, questions=[q for q, _ in MATH_PROBLEMS],
            engine_kw={"graphs": s.graphs, "weights": s.weights, **s.budget_kw()},
        )  # fmt: skip
        r = report.ratios["baseline/choreographed"]
        for metric, label in (("wall_s", "wall"), ("ttft_s", "mean TTFT")):
            ci = f"95% CI {r[metric].low:.2f}-{r[metric].high:.2f}"
            note = f"{ci}, equal work: {report.equal_work}"
            title = f"{name}: baseline / choreographed {label}"
            out.append(Figure("workflows", title, r[metric].mean, 1.0, "x", note))
    return out


async def account_figures(s: Settings, out: Path | None, console: Console) -> list[Figure]:
    """Each pattern's per-phase account in both modes (`corps.bench.account`): its
    table printed and its lines written as it comes; as figures, choreographed
    against the baseline: wall, mean TTFT, and kernels (the profiler's on CUDA, the
    op counter's elsewhere)."""
    from corps.bench import account as ba
    from corps.patterns import PATTERNS

    rows, errors = await ba.measure(
        s.model, list(s.patterns or PATTERNS), max_tokens=s.workflow_tokens, device=s.device,
        dtype=s.dtype, count=s.account_count, out=out, console=console,
        engine_kw={"graphs": s.graphs, "weights": s.weights, **s.budget_kw()},
    )  # fmt: skip
    figures = []
    note = f"reference: baseline; equal work, max_tokens {s.workflow_tokens}, seed 0"
    by = {(r.pattern, r.mode): r for r in rows}
    for pattern in dict.fromkeys(r.pattern for r in rows):
        c, b = by[pattern, "choreographed"], by[pattern, "baseline"]
        kc, kb = (sum(c.kernels.values()), sum(b.kernels.values())) if c.kernels else (
            sum(c.launches.values()), sum(b.launches.values()))  # fmt: skip
        figures += [
            Figure("account", f"{pattern} wall", c.wall_s, b.wall_s, "s", note),
            Figure("account", f"{pattern} mean TTFT", c.ttft_s * 1e3, b.ttft_s * 1e3, "ms", note),
            Figure(
                "account", f"{pattern} kernels", kc, kb, "", note, c.count_error or b.count_error
            ),
        ]
    figures += [Figure("account", f"{p} wall", math.nan, math.nan, "s", note, e)
                for p, e in errors.items()]  # fmt: skip
    return figures


async def pattern_figures(s: Settings) -> list[Figure]:
    """Every built-in pattern once per mode (one engine per mode), default settings but
    a decode budget of `s.workflow_tokens`; a pattern that fails is a figure with its
    error, and the others still run."""
    import warnings

    from corps.cache.visibility import LeakWarning
    from corps.patterns import PATTERNS

    walls: dict[tuple[str, str], float] = {}
    errors: dict[str, str] = {}
    for mode in ("baseline", "choreographed"):
        with warnings.catch_warnings():
            # the prisoner's dilemma leaks on purpose (it shows the leak policies)
            warnings.simplefilter("ignore", LeakWarning)
            await _patterns_in(s, mode, walls, errors)
        release(s.device)
    note = f"reference: baseline wall; max_tokens {s.workflow_tokens}, seed 0"
    return [
        Figure("patterns", f"{name} wall", walls.get(("choreographed", name), math.nan),
               walls.get(("baseline", name), math.nan), "s", note, errors.get(name, ""))
        for name in PATTERNS
    ]  # fmt: skip


async def _patterns_in(s: Settings, mode: str, walls: dict, errors: dict) -> None:
    """Each built-in pattern once on one engine of `mode`: its wall time into `walls`,
    or its error into `errors`."""
    from corps.agents import Runtime
    from corps.engine import Engine
    from corps.patterns import PATTERNS, run_pattern

    async with Engine.open(s.model, mode=mode, graphs=s.graphs, **s.engine_kw()) as engine:
        async with Runtime(engine) as rt:
            for name in PATTERNS:
                params = {"max_tokens": s.workflow_tokens, "seed": 0}
                try:
                    walls[mode, name] = await timed(
                        s.device, lambda n=name, p=params: run_pattern(rt, n, p), 1
                    )
                except Exception as exc:  # reported as the pattern's figure
                    errors.setdefault(name, f"{mode}: {exc!r}")
