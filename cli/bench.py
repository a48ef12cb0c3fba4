"""`corps bench ...`: each benchmark's options, wired to its module in `corps.bench`."""

from __future__ import annotations

import importlib.util
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from corps.cache.errors import CorpsError
from corps.cli.options import (
    DecisionRepairOpt,
    DtypeOpt,
    ModelOpt,
    RepairOpt,
    WeightsOpt,
    dtype_option,
    err,
    fail,
)
from corps.cli.options import bad as _bad
from corps.engine.config import DEFAULT_DTYPE, BadConfig, EngineConfig
from corps.engine.model.adapter_files import check_adapter_of

T = TypeVar("T")

bench_app = typer.Typer(
    help="Benchmarks that print measured ratios side by side.", no_args_is_help=True
)

#: `corps bench gpu --workflows` (corps.bench.gpu.WORKFLOWS, named here without torch)
_GPU_WORKFLOWS = ("debate", "tree_of_thoughts", "parallel_debate", "tree_of_thoughts_8x8")
#: `corps bench gpu --sections` (corps.bench.gpu.SECTIONS)
_GPU_SECTIONS = (
    "prefill", "decode", "streams", "profile", "graphs", "patterns", "memory", "workflows",
    "account",
)  # fmt: skip


@bench_app.command("adapter")
def bench_adapter(
    adapter: Annotated[Path, typer.Argument(help="A LoRA adapter directory (PEFT format).")],
    model: ModelOpt = "smollm2-135m",
    dtype: DtypeOpt = DEFAULT_DTYPE,
    decode_tokens: Annotated[int, typer.Option(min=8)] = 64,
    prefill_tokens: Annotated[int, typer.Option(min=8)] = 512,
    repeats: Annotated[int, typer.Option(min=1, help="Best of this many runs.")] = 5,
) -> None:
    """Decode and prefill tokens/s with an adapter beside the base model (for one of
    scope rewired: on chain and on rewired calls, with and without its merged copy)."""
    from corps.bench.adapter import main

    try:
        check_adapter_of(EngineConfig.of(model, adapter=adapter), err)
    except BadConfig as exc:
        _bad(exc.for_cli())
    except CorpsError as exc:
        _bad(str(exc))
    try:
        main(model, adapter, dtype, decode_tokens, prefill_tokens, repeats)
    except CorpsError as exc:
        fail(exc)


@bench_app.command("runner")
def bench_runner(
    model: ModelOpt = "smollm2-135m",
    dtypes: Annotated[
        str, typer.Option(help="Comma-separated dtypes to measure.")
    ] = "float32,bfloat16",
    decode_tokens: Annotated[int, typer.Option(min=8)] = 64,
    prefill_tokens: Annotated[int, typer.Option(min=8)] = 512,
    repeats: Annotated[int, typer.Option(min=1, help="Best of this many runs.")] = 3,
    compile: Annotated[
        bool,
        typer.Option(help="Also measure an engine with the captured decode step (compile=True)."),
    ] = False,
    compile_gemms: Annotated[
        str,
        typer.Option(
            help="With --compile: comma-separated products of the captured step to measure, "
            "one engine each: library (oneDNN/MKL) and/or autotune (inductor's own, timed)."
        ),
    ] = "library",
) -> None:
    """Single-stream decode and prefill tokens/s: our runner next to HF generate."""
    from corps.bench.runner import main

    names = [d.strip() for d in dtypes.split(",") if d.strip()]
    gemms = [g.strip() for g in compile_gemms.split(",") if g.strip()] if compile else []
    try:
        for name in names:
            EngineConfig.of(dtype=name)
    except CorpsError as exc:
        _bad(f"--dtypes: {exc}")
    try:
        for g in gemms:
            EngineConfig.of(compile=True, compile_gemms=g)
    except BadConfig as exc:
        _bad(f"--compile-gemms: {exc}")
    try:
        main(model, names, decode_tokens, prefill_tokens, repeats, gemms)
    except CorpsError as exc:
        fail(exc)


#: The largest count `--streams` and its kind take (more would only exhaust memory).
MAX_COUNT = 4096


def _stream_counts(streams: str, option: str = "--streams") -> list[int]:
    """`--streams` (or another such `option`) as counts >= 1 (bad input: one line,
    exit 2)."""
    try:
        counts = [int(x) for x in streams.split(",") if x.strip()]
    except ValueError:
        _bad(f"{option} takes comma-separated counts like 1,4,16, got {streams!r}")
    if not counts or min(counts) < 1 or max(counts) > MAX_COUNT:
        _bad(f"{option} takes counts from 1 to {MAX_COUNT}, got {streams!r}")
    return counts


@bench_app.command("batching")
def bench_batching(
    model: ModelOpt = "smollm2-135m",
    dtype: DtypeOpt = DEFAULT_DTYPE,
    weights: WeightsOpt = "auto",
    streams: Annotated[str, typer.Option(help="Comma-separated stream counts.")] = "1,4,16,64",
    tokens: Annotated[int, typer.Option(min=2, help="Tokens decoded per stream.")] = 32,
    rounds: Annotated[
        int,
        typer.Option(
            min=1, help="Run the counts round-robin this many times; report medians and ranges."
        ),
    ] = 1,
) -> None:
    """Aggregate decode tokens/s for concurrent streams through the batching loop."""
    from corps.bench.batching import main

    counts = _stream_counts(streams)
    try:
        main(model, dtype, counts, tokens, rounds, weights)
    except CorpsError as exc:
        fail(exc)


@bench_app.command("step")
def bench_step(
    model: ModelOpt = "dummy:tiny",
    dtype: DtypeOpt = "float32",
    streams: Annotated[str, typer.Option(help="Comma-separated stream counts.")] = "1,16,64",
    tokens: Annotated[int, typer.Option(min=2, help="Tokens decoded per stream.")] = 64,
    rounds: Annotated[
        int, typer.Option(min=1, help="Round-robin rounds; each count reports its median.")
    ] = 5,
    run_ahead: Annotated[
        str,
        typer.Option(
            help="Comma-separated run_ahead settings, one engine each (1: a hop to the "
            "event loop after every step)."
        ),
    ] = "1,8",
    top_logprobs: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=20,
            help="Every call also keeps its tokens' log-probabilities and this many "
            "most likely tokens (off by default).",
        ),
    ] = None,
) -> None:
    """The host's share of a decode step: per step at 1, 16 and 64 streams, the time
    outside the model's forward (plan, batch, sample, postprocess, job completion),
    with steps handed back to the event loop one by one and run ahead."""
    from corps.bench.step import main

    counts = _stream_counts(streams)
    aheads = _stream_counts(run_ahead, "--run-ahead")
    try:
        main(model, tokens, rounds, counts, aheads, top_logprobs, dtype=dtype)
    except CorpsError as exc:
        fail(exc)


@bench_app.command("ops")
def bench_ops(
    model: ModelOpt = "dummy:llama-3.2-1b",
    dtype: Annotated[str, typer.Option(help="Weights, activations and KV store.")] = "bfloat16",
    step_tokens: Annotated[
        str, typer.Option(help="Comma-separated step_tokens settings, one engine each.")
    ] = "512,4096",
    prompt_tokens: Annotated[int, typer.Option(min=1, help="The lone prompt's tokens.")] = 2048,
    spans: Annotated[int, typer.Option(min=1, help="Spans over a shared context.")] = 16,
    span_tokens: Annotated[int, typer.Option(min=1)] = 128,
    context_tokens: Annotated[int, typer.Option(min=1)] = 1024,
) -> None:
    """The torch ops a prefill runs per step and layer, counted on this machine: the
    proxy for a GPU's kernel launches (a lone prompt; spans over a shared context)."""
    from corps.bench.ops import main

    try:
        settings = [int(x) for x in step_tokens.split(",") if x.strip()]
        if not settings or min(settings) < 1:
            raise ValueError("give positive integers")
    except ValueError as exc:
        _bad(f"--step-tokens: {exc}")
    try:
        main(model, dtype, settings, prompt=prompt_tokens, spans=spans, span_tokens=span_tokens,
             context=context_tokens)  # fmt: skip
    except CorpsError as exc:
        fail(exc)


def _pattern_names(patterns: str | None) -> tuple[str, ...]:
    """--patterns: the built-in patterns named (all when None); bad names refused."""
    from corps.patterns.registry import PATTERNS

    if patterns is None:
        return tuple(PATTERNS)
    names = tuple(p.strip().replace("-", "_") for p in patterns.split(",") if p.strip())
    unknown = sorted(set(names) - set(PATTERNS))
    if unknown or not names:
        _bad(f"--patterns: unknown {', '.join(unknown) or '(none given)'}; "
             f"choose from {', '.join(PATTERNS)}")  # fmt: skip
    return names


@bench_app.command("account")
def bench_account(
    model: ModelOpt = "smollm2-135m",
    dtype: DtypeOpt = DEFAULT_DTYPE,
    device: Annotated[
        str | None, typer.Option(help="cuda[:N] or cpu (default: cuda when there is one).")
    ] = None,
    patterns: Annotated[
        str | None, typer.Option(help="Comma-separated built-in patterns (default: all).")
    ] = None,
    max_tokens: Annotated[int, typer.Option(min=1, max=4096, help="Decode budget per call.")] = 32,
    count: Annotated[
        str,
        typer.Option(
            help="The counted run: none; ops (the op counter's launches per phase, the "
            "CPU's proxy for a GPU's); kernels (those and, on CUDA, the profiler's kernels "
            "per phase: slow to read on a large model)."
        ),
    ] = "kernels",
    out: Annotated[
        str | None, typer.Option("--out", help="JSON lines, one per pattern and mode.")
    ] = None,
) -> None:
    """Where each pattern's time goes, phase by phase (admission, context placement,
    prefill, decode, repair, masks, sampling, outside the steps), baseline and
    choreographed side by side on equal work, with the kernel launches of each phase."""
    import anyio
    import torch

    from corps.bench import account as ba

    names = _pattern_names(patterns)
    if count not in ba.COUNTS:
        _bad(f"--count: {count!r}; choose from {', '.join(ba.COUNTS)}")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        EngineConfig.of(model, dtype=dtype, device=device)
    except (ValueError, CorpsError) as exc:
        _bad(str(exc))
    console = Console(width=max(150, Console().width))
    try:
        rows, errors = anyio.run(lambda: ba.measure(
            model, list(names), max_tokens=max_tokens, device=device, dtype=dtype,
            count=count, out=Path(out) if out else None, console=console,
        ))  # fmt: skip
    except CorpsError as exc:
        fail(exc)
    errors.update({f"{r.pattern} ({r.mode}) counted run": r.count_error
                   for r in rows if r.count_error})  # fmt: skip
    if errors:
        err.print("[bold red]failed:[/] " + "; ".join(f"{p}: {e}" for p, e in errors.items()))
        raise typer.Exit(1)


@bench_app.command("audit")
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
    from corps.cli.fidelity import _lines
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
            _run_bench(
                lambda: ba.agreement(
                    name, lines, seed, model, dtype, concurrency, repair, decisions, bound
                )
            )
            if agreement
            else []
        )
        costs = (
            _run_bench(
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


@bench_app.command("workflow")
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

    params, chosen = _bench_args(pattern, set_, impls)
    takes = registry.params_model(registry.get(pattern)).model_fields
    questions = [q for q, _ in MATH_PROBLEMS] if "question" in takes else None
    try:
        repair = EngineConfig.of(repair=repair).repair
    except CorpsError as exc:
        _bad(str(exc))
    report = _measure(bw, pattern, params, chosen, runs, warmup, model, dtype, questions, repair)
    Console().print(bw.table(report), bw.ratio_table(report))
    _write(bw, [report], json_out, plot_out)


@bench_app.command("constrained")
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

    names = None
    if patterns is not None:
        names = [p.strip().replace("-", "_") for p in patterns.split(",") if p.strip()]
        unknown = sorted(set(names) - set(bc.PATTERNS))
        if unknown:
            _bad(f"--patterns: {', '.join(unknown)}; choose from {', '.join(bc.PATTERNS)}")
    settings = dict(seeds=seeds, calls=calls, tokens=tokens, runs=runs, libs=libraries)
    report = _run_bench(lambda: bc.measure(model, dtype, patterns=names, **settings))
    _report(report, bc.tables(report), json_out)


@bench_app.command("mapreduce")
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


@bench_app.command("serve")
def bench_serve(
    load: Annotated[
        str, typer.Option(help="Arrival rates as fractions of saturation, comma-separated.")
    ] = "0.5,0.8,1.2",
    policies: Annotated[
        str,
        typer.Option(
            help="Policies to compare, comma-separated; name:N also caps workflows in flight "
            "at N on that engine (workflow:8), the rest queued whole, first come first served."
        ),
    ] = "fcfs,workflow,objective",
    duration: Annotated[float, typer.Option(min=1, help="Seconds of arrivals per cell.")] = 60,
    chat: Annotated[int, typer.Option(min=0, help="Chat streams (latency) per cell.")] = 0,
    mix: Annotated[
        str | None,
        typer.Option(
            help="Patterns in the mix, comma-separated (their small settings), or a .json / "
            ".toml file mapping patterns to settings."
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the arrival schedule.")] = 0,
    schedules: Annotated[
        int,
        typer.Option(
            min=1,
            help="Seeded arrival schedules per load, each run under every policy, pooled "
            "into one row per policy: a p99 over one schedule's few dozen workflows is its "
            "slowest one or two.",
        ),
    ] = 1,
    saturation: Annotated[
        float | None,
        typer.Option(
            min=0.001,
            help="Workflows/min the loads are fractions of (default: measured first, "
            "closed loop); give a past run's figure to run the same loads again.",
        ),
    ] = None,
    saturation_window: Annotated[
        float,
        typer.Option(
            min=1,
            help="Seconds of steady closed-loop load per concurrency tried (8, 16, 32, "
            "64 while throughput rises) to measure saturation.",
        ),
    ] = 30,
    alone: Annotated[
        bool,
        typer.Option(
            help="Also run each workflow of a load's schedule by itself on an idle engine: "
            "the floor under any policy's latency, and each workflow's slowdown."
        ),
    ] = True,
    trace: Annotated[
        Path | None,
        typer.Option(
            help="Directory: each engine's trace (load0.8-fcfs.jsonl, ...) for corps trace view."
        ),
    ] = None,
    model: ModelOpt = "smollm2-135m",
    dtype: DtypeOpt = DEFAULT_DTYPE,
    json_out: Annotated[str | None, typer.Option("--json", help="Write the report here.")] = None,
    plot: Annotated[
        str | None,
        typer.Option("--plot", help="PNG: latency and throughput against load per policy."),
    ] = None,
) -> None:
    """Workflows arriving open loop at fractions of saturation, under each policy."""
    from corps.bench import serve as bs

    try:
        loads = [float(x) for x in load.split(",") if x.strip()]
    except ValueError:
        _bad(f"--load: comma-separated numbers, got {load!r}")
    chosen = list(dict.fromkeys(p.strip() for p in policies.split(",") if p.strip()))
    for spec in chosen:
        try:
            bs.engine_settings(spec)
        except ValueError as exc:
            _bad(f"--policies: {exc}")
    if not chosen:
        _bad(f"--policies: name at least one of {', '.join(bs.POLICIES)}")
    patterns = dict(bs.MIX)
    if mix is not None:
        try:
            patterns = bs.load_mix(mix)
        except CorpsError as exc:
            _bad(str(exc))
    if plot is not None and importlib.util.find_spec("matplotlib") is None:
        from corps.bench.plotting import INSTALL

        _bad(INSTALL)
    if not loads or any(x <= 0 for x in loads):
        _bad("--load: positive fractions of saturation, e.g. 0.5,0.8,1.2")
    settings = dict(dtype=dtype, loads=loads, policies=chosen, duration=duration, chat=chat,
                    mix=patterns, seed=seed, alone=alone, trace_dir=trace, schedules=schedules,
                    saturation_per_s=None if saturation is None else saturation / 60,
                    saturation_window_s=saturation_window)  # fmt: skip
    report = _run_bench(lambda: bs.measure(model, **settings))
    _report(report, [bs.table(report), bs.ratios(report)], json_out, width=140)
    if plot is not None:
        bs.plot(report, plot)
        err.print(f"plot: {plot}")


@bench_app.command("cluster")
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
    report = _run_bench(lambda: bc.measure(model, **settings))
    _report(report, bc.tables(report), json_out)


@bench_app.command("trace")
def bench_trace(
    pattern: Annotated[str, typer.Argument(help="A built-in pattern.")] = "tree_of_thoughts",
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="key=value parameter (repeatable).")
    ] = None,
    runs: Annotated[int, typer.Option(min=1, help="Measured runs (each traced and not).")] = 5,
    warmup: Annotated[int, typer.Option(min=0)] = 1,
    model: ModelOpt = "smollm2-135m",
    dtype: DtypeOpt = DEFAULT_DTYPE,
    live: Annotated[
        bool, typer.Option("--live", help="The traced runs also draw the live view off-screen.")
    ] = False,
) -> None:
    """What recording a trace costs: the same workflow traced and untraced, alternated."""
    from corps.bench import trace as bt

    params, _ = _bench_args(pattern, set_, "baseline,choreographed")
    cost = _run_bench(
        lambda: bt.measure(
            pattern.replace("-", "_"),
            params,
            model=model,
            runs=runs,
            warmup=warmup,
            dtype=dtype,
            live=_offscreen_view if live else None,
        )
    )
    Console().print(bt.table(cost))


def _offscreen_view():
    """The live view drawing into an off-screen terminal (what `bench trace --live` times)."""
    import io

    from corps.view.live import LiveView

    return LiveView(Console(file=io.StringIO(), force_terminal=True, width=120))


@bench_app.command("soak")
def bench_soak(
    workflows: Annotated[int, typer.Option(min=1, help="Workflows to run.")] = 1000,
    concurrency: Annotated[int, typer.Option(min=1, help="Workflows in flight.")] = 32,
    faults: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Share of workflows replaced by a fault.")
    ] = 0.1,
    max_tokens: Annotated[int, typer.Option(min=1, help="Decode budget per call.")] = 8,
    seed: Annotated[int, typer.Option(help="Seeds the mix and the faults.")] = 0,
    capacity: Annotated[
        int | None, typer.Option(min=64, help="Store tokens (default: from the memory budget).")
    ] = None,
    deadline: Annotated[
        float, typer.Option(min=1.0, help="Seconds before a workflow counts as hung.")
    ] = 300.0,
    admission: Annotated[
        bool, typer.Option(help="Workflow-level admission (off: every workflow starts at once).")
    ] = True,
    evict: Annotated[
        bool,
        typer.Option(
            help="Preemption: with the store full, drop encodings no call reads and "
            "recompute them when read (off: such a call fails)."
        ),
    ] = True,
    model: ModelOpt = "smollm2-135m",
    dtype: DtypeOpt = DEFAULT_DTYPE,
    json_out: Annotated[str | None, typer.Option("--json", help="Write the report here.")] = None,
) -> None:
    """Many workflows with injected faults through one engine: failures, hangs, memory, speed."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from corps.bench import soak as bs

    bar = Progress("workflows", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err)
    task = bar.add_task("soak", total=workflows)
    with bar:
        report = _run_bench(
            lambda: bs.soak(
                model=model,
                workflows=workflows,
                concurrency=concurrency,
                faults=faults,
                max_tokens=max_tokens,
                seed=seed,
                deadline_s=deadline,
                capacity=capacity,
                dtype=dtype,
                admission=admission,
                evict=evict,
                progress=lambda n: bar.update(task, completed=n),
            )
        )
    console = Console()
    console.print(bs.table(report))
    for e in report.errors:
        console.print(f"  [red]{e}[/]", highlight=False)
    if json_out:
        with open(json_out, "w") as f:
            f.write(report.model_dump_json(indent=1) + "\n")
    if report.unexplained or report.hung:
        raise typer.Exit(1)


@bench_app.command("memory")
def bench_memory(
    calls: Annotated[int, typer.Option(min=1, help="Concurrent long decodes.")] = 64,
    max_tokens: Annotated[int, typer.Option(min=1, help="Tokens each decodes.")] = 96,
    capacity: Annotated[
        int, typer.Option(min=256, help="Store tokens for the admission run.")
    ] = 2048,
    branches: Annotated[int, typer.Option(min=1)] = 16,
    voters: Annotated[int, typer.Option(min=1)] = 16,
    branch_tokens: Annotated[int, typer.Option(min=1)] = 256,
    prompt_tokens: Annotated[
        int, typer.Option(min=0, help="Long prompt arriving during 16 decodes (0: skip).")
    ] = 4096,
    model: ModelOpt = "smollm2-135m",
    dtype: Annotated[
        str,
        typer.Option(
            help="float32 by default here: batched calls equal to alone needs kernels that "
            "do not depend on the step's row count, which mixed's do.",
            callback=dtype_option,
        ),
    ] = "float32",
) -> None:
    """Admission under memory pressure, view memory over a shared context, and a long
    prompt arriving while decodes run."""
    from corps.bench import memory as bm

    async def all_three():
        adm = await bm.admission(
            model, calls=calls, max_tokens=max_tokens, capacity=capacity, dtype=dtype
        )
        ctx = [
            await bm.shared_context(
                model,
                branches=branches,
                voters=voters,
                branch_tokens=branch_tokens,
                dtype=dtype,
                contexts=contexts,
            )
            for contexts in ("copy", "store")
        ]
        decodes = [
            await bm.context_decode(model, contexts=c, context_tokens=n, calls=k, dtype=dtype)
            for n, k in ((512, 1), (2048, 1), (2048, 8))
            for c in ("copy", "store")
        ]
        long = None
        if prompt_tokens:
            long = await bm.long_prefill(model, prompt_tokens=prompt_tokens, dtype=dtype)
        return adm, ctx, long, decodes

    adm, ctx, long, decodes = _run_bench(all_three)
    Console().print(*bm.tables(adm, ctx, long, decodes))


@bench_app.command("vs-llamacpp")
def bench_vs_llamacpp(
    cells: Annotated[str, typer.Option(help="Comma-separated BxV cells.")] = "4x4,8x8,16x4",
    runs: Annotated[int, typer.Option(min=1, help="Measured runs per cell.")] = 2,
    warmup: Annotated[int, typer.Option(min=0)] = 1,
    threads: Annotated[int, typer.Option(min=1, help="llama.cpp threads.")] = 2,
    dtype: DtypeOpt = DEFAULT_DTYPE,
    weights: WeightsOpt = "auto",
    stream_runs: Annotated[
        int, typer.Option(min=0, help="Runs of the one-chat-stream comparison (0: skip it).")
    ] = 3,
    compile: Annotated[
        bool, typer.Option(help="corps with its one-row decode step captured (compile=True).")
    ] = False,
    precompiled: Annotated[
        str,
        typer.Option(
            help="corps' precompiled decode step: build (default: built now if this machine "
            "has none, as a user's first run leaves it for the next), auto or off."
        ),
    ] = "build",
) -> None:
    """One chat stream and a tree-of-thoughts-shaped workflow: llama.cpp (its GGUF) vs
    corps on the same file, interleaved run by run."""
    from corps.bench import llamacpp as bl

    try:
        shape = [tuple(int(x) for x in c.lower().split("x")) for c in cells.split(",") if c]
        assert (shape or stream_runs) and all(len(c) == 2 and min(c) >= 1 for c in shape)
    except (ValueError, AssertionError):
        _bad(f"--cells takes BxV pairs like 4x4,8x8, got {cells!r}")
    try:
        EngineConfig.of(precompiled=precompiled)
    except BadConfig as exc:
        _bad(exc.for_cli())
    try:
        stream, result = _run_bench(
            lambda: bl.measure(
                shape,
                runs=runs,
                warmup=warmup,
                threads=threads,
                dtype=dtype,
                weights=weights,
                stream_runs=stream_runs,
                compile=compile,
                precompiled=precompiled,
            )
        )
    except bl.MissingLlamaCpp as exc:
        _bad(str(exc))
    if stream is not None:
        Console().print(bl.stream_table(stream, weights, precompiled))
    if result:
        Console().print(bl.table(result, dtype, weights))


@bench_app.command("kernels")
def bench_kernels(
    device: Annotated[str, typer.Option(help="cuda (or cpu under TRITON_INTERPRET=1).")] = "cuda",
    repeats: Annotated[int, typer.Option(min=1, help="Timed runs per kernel (median).")] = 20,
    small: Annotated[bool, typer.Option(help="Small shapes (for the interpreter).")] = False,
    cpu: Annotated[
        bool,
        typer.Option(
            "--cpu",
            help="Instead: the CPU product kernels dtype=auto chooses from, timed on this "
            "machine for the model's shapes (read from the cache; --remeasure to time again).",
        ),
    ] = False,
    model: ModelOpt = "smollm2-135m",
    remeasure: Annotated[bool, typer.Option(help="With --cpu: time again, not cached.")] = False,
) -> None:
    """The CUDA kernels timed against their torch references and SDPA (needs a GPU), or
    with --cpu the product kernels dtype="auto" chooses from on this CPU."""
    if cpu:
        try:
            _cpu_kernels(model, remeasure)
        except CorpsError as exc:
            fail(exc)
        return
    from corps.bench import kernels as bk

    why = bk.unavailable(device)
    if why is not None:
        if why.startswith("no CUDA device"):
            Console().print(why)
            return
        _bad(why)
    Console().print(bk.table(bk.measure(device, small=small, repeats=repeats), device))


def _cpu_kernels(model: str, remeasure: bool) -> None:
    from corps.bench import kernels as bk
    from corps.engine.model.names import resolve_model

    table, fresh = bk.cpu_kernels(resolve_model(model, console=err), remeasure)
    Console(width=max(150, Console().width)).print(table)
    if fresh:
        Console().print("[dim](timed now; later loads read the cache)[/]")


@bench_app.command("gpu")
def bench_gpu(
    model: ModelOpt = "dummy:llama-3.2-1b",
    dtype: Annotated[str, typer.Option(help="Weights, activations and KV store.")] = "bfloat16",
    weights: WeightsOpt = "auto",
    device: Annotated[
        str | None, typer.Option(help="cuda[:N] or cpu (default: cuda when there is one).")
    ] = None,
    prompt_tokens: Annotated[int, typer.Option(min=8, help="The long prompt's tokens.")] = 2048,
    spans: Annotated[int, typer.Option(min=1, help="Short spans over a shared context.")] = 16,
    span_tokens: Annotated[int, typer.Option(min=1)] = 128,
    context_tokens: Annotated[int, typer.Option(min=1)] = 1024,
    decode_tokens: Annotated[int, typer.Option(min=8, help="One stream's tokens.")] = 128,
    streams: Annotated[str, typer.Option(help="Comma-separated stream counts.")] = "16,64",
    stream_tokens: Annotated[int, typer.Option(min=2)] = 64,
    workflows: Annotated[
        str, typer.Option(help="Comma-separated, of: " + ", ".join(_GPU_WORKFLOWS))
    ] = ",".join(_GPU_WORKFLOWS),
    workflow_tokens: Annotated[int, typer.Option(min=1, help="Decode budget per call.")] = 64,
    runs: Annotated[int, typer.Option(min=1, help="Measured runs per workflow.")] = 2,
    repeats: Annotated[int, typer.Option(min=1, help="Best of this many timings.")] = 3,
    graphs: Annotated[
        str,
        typer.Option(
            help="Decode steps over static buffers: auto (CUDA graphs on a GPU), capture, "
            "static or off. Unless off, decode is measured again with off, side by side."
        ),
    ] = "auto",
    sections: Annotated[
        str, typer.Option(help="Comma-separated, of: " + ", ".join(_GPU_SECTIONS))
    ] = ",".join(_GPU_SECTIONS),
    memory_budget: Annotated[
        float | None,
        typer.Option(
            min=0.5,
            help="GiB of KV store and views for each measured engine (default: 16 on a GPU, "
            "so that transformers' copy or a second engine fits beside it; the engine's own "
            "default on a CPU). The memory section always opens at the default sizing.",
        ),
    ] = None,
    engines: Annotated[
        int, typer.Option(min=1, max=16, help="The memory section's engines, in sequence.")
    ] = 4,
    patterns: Annotated[
        str | None,
        typer.Option(help="The account section's built-in patterns, comma-separated (all)."),
    ] = None,
    account_count: Annotated[
        str, typer.Option(help="The account's counted run: none, ops or kernels.")
    ] = "kernels",
    out: Annotated[
        str | None, typer.Option("--out", help="JSON lines, one per figure, as they come.")
    ] = None,
) -> None:
    """The GPU figures of one model in one run: prefill (one prompt; spans over a shared
    context) and decode (one stream, many) against transformers and the bandwidth bound,
    workflows choreographed against the baseline, every built-in pattern in both modes,
    memory given back on close, and each pattern's per-phase account. Exits 1 if any
    section fails."""
    import anyio
    import torch

    from corps.bench import gpu as bg

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    chosen = tuple(w.strip().replace("-", "_") for w in workflows.split(",") if w.strip())
    unknown = [w for w in chosen if w not in bg.WORKFLOWS]
    if unknown:
        _bad(f"--workflows: unknown {', '.join(unknown)}; pick of {', '.join(bg.WORKFLOWS)}")
    picked = tuple(x.strip() for x in sections.split(",") if x.strip())
    unknown = [x for x in picked if x not in bg.SECTIONS]
    if unknown:
        _bad(f"--sections: unknown {', '.join(unknown)}; pick of {', '.join(bg.SECTIONS)}")
    from corps.bench.account import COUNTS

    if account_count not in COUNTS:
        _bad(f"--account-count: {account_count!r}; choose from {', '.join(COUNTS)}")
    if memory_budget is None and device.startswith("cuda"):
        memory_budget = 16.0
    try:
        counts = tuple(int(x) for x in streams.split(",") if x.strip())
        EngineConfig.of(model, dtype=dtype, device=device, graphs=graphs, weights=weights)
    except (ValueError, CorpsError) as exc:
        _bad(str(exc))
    settings = bg.Settings(
        model=model, dtype=dtype, weights=weights, device=device, prompt_tokens=prompt_tokens,
        spans=spans,
        span_tokens=span_tokens, context_tokens=context_tokens, decode_tokens=decode_tokens,
        streams=counts, stream_tokens=stream_tokens, workflows=chosen,
        workflow_tokens=workflow_tokens, runs=runs, repeats=repeats, graphs=graphs,
        sections=picked, engines=engines, patterns=_pattern_names(patterns),
        account_count=account_count,
        memory_budget=int(memory_budget * 2**30) if memory_budget else None,
    )  # fmt: skip
    console = Console()
    console.print(f"[dim]{bg.device_name(device)}, torch {torch.__version__}[/]")
    try:
        figures, failures = anyio.run(bg.run, settings, Path(out) if out else None, console)
    except CorpsError as exc:
        fail(exc)
    console.print(bg.table(settings, figures))
    if failures:
        err.print(f"[bold red]{len(failures)} section(s) failed:[/] " + "; ".join(failures))
        raise typer.Exit(1)


@bench_app.command("http")
def bench_http(
    model: ModelOpt = "smollm2-135m",
    dtype: DtypeOpt = DEFAULT_DTYPE,
    clients: Annotated[int, typer.Option(min=1, max=256, help="Concurrent clients.")] = 8,
    requests: Annotated[int, typer.Option(min=1, help="Requests per client, in turn.")] = 4,
    tokens: Annotated[int, typer.Option(min=1, help="Tokens per reply (greedy).")] = 16,
    rounds: Annotated[int, typer.Option(min=1, help="Rounds of (python, http).")] = 2,
    overhead: Annotated[
        bool, typer.Option(help="The workload through the Python API and over HTTP.")
    ] = True,
    workflow: Annotated[
        bool,
        typer.Option(help="A tree of thoughts over HTTP: text resent (baseline mode) vs by id."),
    ] = False,
    branches: Annotated[int, typer.Option(min=1, help="--workflow: proposals.")] = 4,
    voters: Annotated[int, typer.Option(min=1, help="--workflow: votes.")] = 4,
    structured: Annotated[
        int, typer.Option(min=0, help="Requests of each structured kind to check (0: none).")
    ] = 0,
) -> None:
    """The HTTP layer's cost (the same chat workload through the Python API and through
    `corps serve` with the openai client, side by side); with --workflow, a workflow
    over HTTP resending text against naming messages by id; with --structured N, parse
    failures of JSON replies and tool calls, constrained and free. Needs corps[serve]
    and openai."""
    try:
        import openai  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        _bad(f"corps bench http needs {exc.name}: pip install 'corps[serve]' openai")
    from corps.bench import http as bh

    try:
        cfg = EngineConfig.of(model, dtype=dtype)
    except CorpsError as exc:
        _bad(str(exc))
    console = Console()
    try:
        if overhead:
            cells = bh.measure(cfg, model, clients, requests, tokens, rounds)
            title = (f"chat over HTTP vs the Python API ({model}, {cfg.dtype}, {clients} clients"
                     f" x {requests} requests x {tokens} tokens, median of {rounds})")  # fmt: skip
            console.print(bh.table(cells, title))
        if workflow:
            flows = [bh.flow(cfg, model, by_id, branches, voters, tokens)
                     for by_id in (False, True)]  # fmt: skip
            title = f"tree of thoughts {branches}x{voters} over HTTP ({model}, {tokens} tokens)"
            console.print(bh.flow_table(flows, title))
        if structured:
            counts = bh.structured(cfg, model, structured, max(tokens, 48))
            console.print(bh.structured_table(counts, f"structured replies ({model})"))
    except CorpsError as exc:
        fail(exc)


@bench_app.command("workflows")
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
        _, chosen = _bench_args(pattern, [], impls)
        params = {**params, "max_tokens": max_tokens}
        reports.append(_measure(bw, pattern, params, chosen, runs, warmup, model, dtype, questions))
        console.print(bw.table(reports[-1]), bw.ratio_table(reports[-1]))
    sizes = [int(x) for x in sweep.split(",") if x.strip()]
    cells = {}
    for b in sizes:
        for v in sizes:
            params = {"branches": b, "voters": v, "max_tokens": max_tokens}
            pair = ("baseline", "choreographed")
            cells[(b, v)] = _measure(
                bw, "tree_of_thoughts", params, pair, runs, warmup, model, dtype, questions
            )
            reports.append(cells[(b, v)])
    if cells:
        for label, value in bw.SWEEP_MAPS:
            title = f"tree of thoughts sweep: baseline/choreographed {label}"
            console.print(bw.sweep_table(cells, sizes, value, title))
    _write(bw, reports, json_out, plot_out)


@bench_app.command("patterns")
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
) -> None:
    """Every built-in pattern in each mode with its defaults (its own decisions, as
    `corps run`): tokens encoded, repaired and cut, TTFT and wall, side by side."""
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
    report = _run_bench(
        lambda: bp.measure(names, budgets, model=model, configs=chosen, seeds=seeds, dtype=dtype)
    )
    _report(report, [bp.table(report)], json_out, width=160)


def _bench_args(pattern: str, set_: list[str] | None, impls: str):
    from corps.cli.scenario import parse_sets
    from corps.patterns import registry

    chosen = tuple(i.strip() for i in impls.split(",") if i.strip())
    bad = [i for i in chosen if i not in ("baseline", "choreographed", "hf")]
    if bad or "baseline" not in chosen or "choreographed" not in chosen:
        _bad(f"--impls takes baseline,choreographed and optionally hf, got {impls!r}")
    try:
        params = parse_sets(set_ or [])
        registry.validate(registry.get(pattern), params)
    except CorpsError as exc:
        _bad(str(exc))
    return params, chosen


def _report(report: Any, tables: list[Any], json_out: str | None, width: int = 120) -> None:
    """Print a benchmark's tables (at least `width` columns wide); its JSON to `json_out`."""
    console = Console(width=max(width, Console().width))
    for table in tables:
        console.print(table)
    if json_out is not None:
        with open(json_out, "w") as f:
            f.write(report.model_dump_json(indent=2))


def _run_bench(work: Callable[[], Awaitable[T]]) -> T:
    """Run a benchmark's coroutine: the patterns' own leak warnings silenced (they are
    counted), a corps error printed as one line (exit 1)."""
    import warnings

    import anyio

    from corps.cache.visibility import LeakWarning

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", LeakWarning)
            return anyio.run(work)
    except CorpsError as exc:
        fail(exc)


def _measure(bw, pattern, params, chosen, runs, warmup, model, dtype, questions, repair="none"):
    return _run_bench(
        lambda: bw.measure(
            pattern,
            params,
            model=model,
            impls=chosen,
            runs=runs,
            warmup=warmup,
            dtype=dtype,
            questions=questions,
            repair=repair,
        )
    )


def _write(bw, reports, json_out: str | None, plot_out: str | None) -> None:
    if json_out:
        with open(json_out, "w") as f:
            f.write("[" + ",\n".join(r.model_dump_json() for r in reports) + "]\n")
    if plot_out:
        try:
            bw.plot(reports, plot_out)
        except RuntimeError as exc:
            fail(CorpsError(str(exc)))
