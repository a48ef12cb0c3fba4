"""`corps bench` over `corps serve`: load against the server, HTTP overhead, soak,
and a traced run's cost."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from corps.cache.errors import CorpsError
from corps.cli.bench_options import (
    bench_args,
    print_report,
    run_bench,
)
from corps.cli.options import (
    DtypeOpt,
    ModelOpt,
    err,
    fail,
)
from corps.cli.options import bad as _bad
from corps.engine.config import DEFAULT_DTYPE, EngineConfig


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
    from corps.bench import serve_mix as bsm
    from corps.bench import serve_report as bsr

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
    patterns = dict(bsm.MIX)
    if mix is not None:
        try:
            patterns = bsm.load_mix(mix)
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
    report = run_bench(lambda: bs.measure(model, **settings))
    print_report(report, [bsr.table(report), bsr.ratios(report)], json_out, width=140)
    if plot is not None:
        bsr.plot(report, plot)
        err.print(f"plot: {plot}")


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

    params, _ = bench_args(pattern, set_, "baseline,choreographed")
    cost = run_bench(
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
    store: Annotated[
        str | None,
        typer.Option(help="A store directory: evicted encodings are copied back, not recomputed."),
    ] = None,
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
        report = run_bench(
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
                store=store,
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
