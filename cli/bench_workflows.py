"""`corps bench` over workflows: audits, one pattern or all, constrained decoding,
map-reduce, clusters, encoded work per pattern."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from corps.cache.errors import CorpsError
from corps.cli.bench_options import (
    bench_args,
    measure_pattern,
    pattern_names,
    print_report,
    run_bench,
    write_reports,
)
from corps.cli.options import (
    DecisionRepairOpt,
    DtypeOpt,
    ModelOpt,
    RepairOpt,
    fail,
)
from corps.cli.options import bad as _bad
from corps.engine.config import DEFAULT_DTYPE, BadConfig, EngineConfig


def bench_audit(
    pattern: Annotated[str, typer.Argument(help="A built-in pattern (see corps scenarios).")],
    inputs: Annotated[
        str | None, typer.Option(help="JSON lines of pattern inputs (default: its own, --n times).")
    ] = None,
    n: Annotated[int, typer.Option(min=1, help="Inputs (the first N lines).")] = 8,
    seed: Annotated[int, typer.Option(help="Input i runs at seed + i.")] = 0,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="key=value parameter (repeatable).")
    ] = None,
    rates: Annotated[
        str,
        typer.Option(help="Comma-separated audit rates N (1 in N) whose cost to time; '' skips."),
    ] = "4,8,16",
    rounds: Annotated[int, typer.Option(min=1, help="Timed passes per rate (medians).")] = 3,
    budget: Annotated[
        float, typer.Option(min=0.001, max=1.0, help="The engines' audit token budget.")
    ] = 0.05,
    concurrency: Annotated[int, typer.Option(min=1, help="Inputs run at once.")] = 4,
    model: ModelOpt = "smollm2-135m",
    dtype: DtypeOpt = "float32",
    json_out: Annotated[str | None, typer.Option("--json", help="Write the report here.")] = None,
    repair: RepairOpt = "none",
    decision_repair: DecisionRepairOpt = None,
    agreement: Annotated[
        bool, typer.Option("--agreement/--no-agreement", help="Measure the agreement part.")
    ] = True,
    bound: Annotated[
        bool,
        typer.Option(
            "--repair-bound/--no-repair-bound",
            help="Cap repairs at the baseline's work (the default) or not.",
        ),
    ] = True,
) -> None:
    """The online fidelity audit beside corps fidelity on the same inputs and tokens
    (per role: the sampled gap and the audit's exact one), and what auditing 1 in N
    calls costs in wall time and tokens, against the same passes unaudited."""
    import json

    from corps.bench import audit as ba
    from corps.cli.eval_options import input_lines as _lines
    from corps.patterns import registry

    try:
        every = [int(r) for r in rates.split(",") if r.strip()]
        if any(r < 1 for r in every):
            raise ValueError
    except ValueError:
        fail(f"--rates: comma-separated rates >= 1, got {rates!r}")
    try:
        lines = _lines(pattern, Path(inputs) if inputs else None, set_, n)
        name = registry.canonical(pattern)
        decisions = EngineConfig.of(decision_repair=decision_repair or "none").decision_repair
    except BadConfig as exc:
        fail(exc.for_cli())
    except CorpsError as exc:
        fail(exc)
    try:
        agree = (
            run_bench(
                lambda: ba.agreement(
                    name, lines, seed, model, dtype, concurrency, repair, decisions, bound
                )
            )
            if agreement
            else []
        )
        costs = (
            run_bench(
                lambda: ba.cost(name, lines, seed, model, dtype, every, rounds, concurrency, budget)
            )
            if every
            else []
        )
    except CorpsError as exc:
        fail(exc)
    shown = repair if decisions == "none" else f"{repair}, decision steps {decisions}"
    shown += "" if bound else ", uncapped"
    ba.show(name, agree, costs, shown)
    if json_out is not None:
        report = dict(
            pattern=name, repair=repair, decision_repair=decisions, agreement=agree, cost=costs
        )
        Path(json_out).write_text(json.dumps(report, indent=2) + "\n")


def bench_workflow(
    pattern: Annotated[str, typer.Argument(help="A built-in pattern (see corps scenarios).")],
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="key=value parameter (repeatable).")
    ] = None,
    runs: Annotated[int, typer.Option(min=1, help="Measured runs per implementation.")] = 3,
    warmup: Annotated[int, typer.Option(min=0, help="Unmeasured runs first.")] = 1,
    impls: Annotated[
        str, typer.Option(help="Comma-separated: baseline, choreographed, hf.")
    ] = "baseline,choreographed,hf",
    model: ModelOpt = "smollm2-135m",
    dtype: DtypeOpt = DEFAULT_DTYPE,
    json_out: Annotated[str | None, typer.Option("--json", help="Write the report here.")] = None,
    plot_out: Annotated[
        str | None, typer.Option("--plot", help="PNG bar chart of the ratios (matplotlib).")
    ] = None,
    repair: RepairOpt = "none",
) -> None:
    """One workflow in each implementation on equal work; ratios with 95% intervals."""
    from corps.bench import workflow as bw
    from corps.patterns import registry
    from corps.patterns.samples import MATH_PROBLEMS

    params, chosen = bench_args(pattern, set_, impls)
    takes = registry.params_model(registry.get(pattern)).model_fields
    questions = [q for q, _ in MATH_PROBLEMS] if "question" in takes else None
    try:
        repair = EngineConfig.of(repair=repair).repair
    except CorpsError as exc:
        _bad(str(exc))
    report = measure_pattern(
        bw, pattern, params, chosen, runs, warmup, model, dtype, questions, repair
    )
    Console().print(bw.table(report), bw.ratio_table(report))
    write_reports(bw, [report], json_out, plot_out)


def bench_constrained(
    seeds: Annotated[
        int, typer.Option(min=1, help="Seeds per pattern (each constrained and free).")
    ] = 10,
    calls: Annotated[
        int, typer.Option(min=1, help="Concurrent decodes in the throughput test.")
    ] = 16,
    tokens: Annotated[int, typer.Option(min=1, help="Tokens each of them decodes.")] = 64,
    runs: Annotated[
        int, typer.Option(min=1, help="Throughput rounds (each free and constrained).")
    ] = 3,
    patterns: Annotated[
        str | None, typer.Option(help="Comma-separated patterns (default: all with fixed forms).")
    ] = None,
    libraries: Annotated[
        bool, typer.Option(help="Also time each installed constrained-decoding library.")
    ] = True,
    model: ModelOpt = "smollm2-135m",
    dtype: DtypeOpt = DEFAULT_DTYPE,
    json_out: Annotated[str | None, typer.Option("--json", help="Write the report here.")] = None,
) -> None:
    """Constraints side by side: library timings, JSON-constrained vs free tokens/s,
    jump-forward's steps, and each pattern's parse errors constrained and free."""
    from corps.bench import constrained as bc

    names = list(pattern_names(patterns, bc.PATTERNS))
    settings = dict(seeds=seeds, calls=calls, tokens=tokens, runs=runs, libs=libraries)
    report = run_bench(lambda: bc.measure(model, dtype, patterns=names, **settings))
    print_report(report, bc.tables(report), json_out)


def bench_mapreduce(
    model: ModelOpt = "smollm2-135m",
    dtype: DtypeOpt = DEFAULT_DTYPE,
    repeat: Annotated[
        int,
        typer.Option(min=1, help="The sample document this many times over (~2.7k tokens each)."),
    ] = 2,
    chunk_tokens: Annotated[int, typer.Option(min=16, help="Tokens per map chunk.")] = 512,
    max_tokens: Annotated[int, typer.Option(min=1, help="Tokens per summary.")] = 48,
    rounds: Annotated[int, typer.Option(min=1, help="Timed runs per configuration.")] = 3,
) -> None:
    """A latency-sensitive map-reduce: its map stage as a task group vs per-call latency caps."""
    from corps.bench.mapreduce import main

    try:
        main(model, dtype, repeat, chunk_tokens, max_tokens, rounds)
    except CorpsError as exc:
        fail(exc)


def bench_cluster(
    n: Annotated[
        int, typer.Option(min=1, help="Workflows (multi-QA pairs) per configuration.")
    ] = 24,
    max_tokens: Annotated[int, typer.Option(min=1, help="Tokens each answer may decode.")] = 32,
    concurrency: Annotated[int, typer.Option(min=1, help="Workflows in flight in all.")] = 4,
    workers: Annotated[int, typer.Option(min=2, help="Workers in the split configuration.")] = 2,
    rounds: Annotated[int, typer.Option(min=1, help="Alternated rounds of every config.")] = 2,
    seed: Annotated[int, typer.Option(help="Seed of the inputs.")] = 0,
    colocation: Annotated[
        bool, typer.Option(help="Also measure prefix co-location (baseline mode).")
    ] = True,
    model: ModelOpt = "smollm2-135m",
    dtype: DtypeOpt = DEFAULT_DTYPE,
    json_out: Annotated[str | None, typer.Option("--json", help="Write the report here.")] = None,
) -> None:
    """Ray workers vs the embedded engine on the same inputs: overhead, driver cost,
    2 workers x 1 thread vs 1 x 2, prefix co-location (needs corps[ray])."""
    try:
        import ray  # noqa: F401
    except ImportError:
        _bad("corps bench cluster needs Ray: pip install 'corps[ray]'")
    from corps.bench import cluster as bc

    settings = dict(dtype=dtype, n=n, max_tokens=max_tokens, concurrency=concurrency,
                    workers=workers, rounds=rounds, seed=seed, colocation=colocation)  # fmt: skip
    report = run_bench(lambda: bc.measure(model, **settings))
    print_report(report, bc.tables(report), json_out)


def bench_workflows(
    runs: Annotated[int, typer.Option(min=1, help="Measured runs per pattern and cell.")] = 3,
    warmup: Annotated[int, typer.Option(min=0)] = 1,
    impls: Annotated[str, typer.Option(help="Implementations for the paper's settings.")] = (
        "baseline,choreographed,hf"
    ),
    sweep: Annotated[str, typer.Option(help="ToT sweep sizes ('' to skip).")] = "2,4,8,16",
    paper: Annotated[
        bool, typer.Option("--paper/--no-paper", help="Run the paper's three settings first.")
    ] = True,
    max_tokens: Annotated[int, typer.Option(min=1, help="Decode budget per call.")] = 64,
    model: ModelOpt = "smollm2-135m",
    dtype: DtypeOpt = DEFAULT_DTYPE,
    json_out: Annotated[str | None, typer.Option("--json", help="Write the reports here.")] = None,
    plot_out: Annotated[str | None, typer.Option("--plot", help="PNG of the ratios.")] = None,
) -> None:
    """The paper's settings (debate, tree of thoughts 8x4, parallel debate 3x3) on short
    math problems, then the tree-of-thoughts sweep as a heat map (baseline vs choreographed)."""
    from corps.bench import workflow as bw
    from corps.patterns.samples import MATH_PROBLEMS

    questions = [q for q, _ in MATH_PROBLEMS]
    reports, console = [], Console()
    for pattern, params in bw.PAPER if paper else ():
        _, chosen = bench_args(pattern, [], impls)
        params = {**params, "max_tokens": max_tokens}
        reports.append(
            measure_pattern(bw, pattern, params, chosen, runs, warmup, model, dtype, questions)
        )
        console.print(bw.table(reports[-1]), bw.ratio_table(reports[-1]))
    sizes = [int(x) for x in sweep.split(",") if x.strip()]
    cells = {}
    for b in sizes:
        for v in sizes:
            params = {"branches": b, "voters": v, "max_tokens": max_tokens}
            pair = ("baseline", "choreographed")
            cells[(b, v)] = measure_pattern(
                bw, "tree_of_thoughts", params, pair, runs, warmup, model, dtype, questions
            )
            reports.append(cells[(b, v)])
    if cells:
        for label, value in bw.SWEEP_MAPS:
            title = f"tree of thoughts sweep: baseline/choreographed {label}"
            console.print(bw.sweep_table(cells, sizes, value, title))
    write_reports(bw, reports, json_out, plot_out)


def bench_patterns(
    patterns: Annotated[
        str, typer.Option(help="Comma-separated built-in patterns ('all': every one).")
    ] = "all",
    max_tokens: Annotated[str, typer.Option(help="Comma-separated decode budgets.")] = "12,128",
    configs: Annotated[
        str, typer.Option(help="Comma-separated: baseline, choreographed, unrepaired, unbounded.")
    ] = "baseline,choreographed,unrepaired",
    seeds: Annotated[int, typer.Option(min=1, help="Runs per cell, seeds 0, 1, ...")] = 1,
    model: ModelOpt = "smollm2-135m",
    dtype: DtypeOpt = "float32",
    json_out: Annotated[str | None, typer.Option("--json", help="Write the runs here.")] = None,
    equal_work: Annotated[
        bool,
        typer.Option(
            "--equal-work/--own-decisions",
            help="Force the baseline's tokens on the other configurations (same calls: "
            "work compared per workflow and per call), or let each decide (as corps run).",
        ),
    ] = False,
) -> None:
    """Every built-in pattern in each mode with its defaults (its own decisions, as
    `corps run`, or on the baseline's tokens): tokens encoded, repaired and cut, TTFT
    and wall, side by side."""
    from corps.bench import patterns as bp
    from corps.patterns import registry

    names = list(registry.PATTERNS) if patterns.strip() == "all" else [
        registry.canonical(p) for p in patterns.split(",") if p.strip()]  # fmt: skip
    chosen = [c.strip() for c in configs.split(",") if c.strip()]
    try:
        for name in names:
            registry.get(name)
        budgets = [int(b) for b in max_tokens.split(",") if b.strip()]
    except (CorpsError, ValueError) as exc:
        _bad(f"--patterns / --max-tokens: {exc}")
    if not names or not budgets or min(budgets) < 1:
        _bad("--patterns and --max-tokens need at least one pattern and budgets >= 1")
    if not chosen or any(c not in bp.CONFIGS for c in chosen):
        _bad(f"--configs takes {', '.join(bp.CONFIGS)}, got {configs!r}")
    if equal_work and "baseline" not in chosen:
        _bad("--equal-work forces the baseline's tokens: --configs must include baseline")
    report = run_bench(
        lambda: bp.measure(
            names,
            budgets,
            model=model,
            configs=chosen,
            seeds=seeds,
            dtype=dtype,
            equal_work=equal_work,
        )
    )
    print_report(report, [bp.table(report)], json_out, width=160)
