"""`corps run` and `corps scenarios`: run workflows from the command line."""

from __future__ import annotations

import io
import json
import os
import secrets
import time
import warnings
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any

import anyio
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from corps.cache.errors import CorpsError
from corps.cache.visibility import LeakWarning
from corps.cli.audits import audit_table
from corps.cli.options import (
    DEBUG_HINT,
    AuditBudgetOpt,
    AuditOpt,
    DecisionRepairOpt,
    PrecompiledOpt,
    RepairBoundOpt,
    RepairOpt,
    WeightsOpt,
    one_line,
    repair_fields,
)
from corps.cli.run_show import Summary, show, show_many
from corps.cli.scenario import ScenarioError, Target, parse_sets, resolve
from corps.engine.config import DEFAULT_DTYPE, DEFAULT_MODEL, BadConfig, EngineConfig
from corps.engine.model.adapter_files import check_adapter_of
from corps.patterns import registry
from corps.patterns.result import to_json

out = Console()
err = Console(stderr=True)


CompileOpt = Annotated[
    bool,
    typer.Option(
        help="Capture the lone one-row decode step with torch.compile: faster single "
        "streams after a compile of tens of seconds when the engine opens (not exact).",
    ),
]
CompileGemmsOpt = Annotated[
    str,
    typer.Option(
        help="With --compile: the captured step's products. library (oneDNN/MKL) or "
        "autotune (inductor's own C++ kernels timed against the library's per shape: "
        "faster on some CPUs, a longer compile)."
    ),
]


def _exit(message: str, code: int) -> None:
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def scenarios() -> None:
    """List the built-in patterns with their parameters and defaults."""
    table = Table(title="built-in patterns: corps run NAME --set key=value ...")
    table.add_column("name")
    table.add_column("what it does")
    table.add_column("parameters (default)")
    for name, fn in registry.PATTERNS.items():
        doc = (fn.__doc__ or "").strip().splitlines()[0]
        params = ", ".join(f"{p}={_short(d)}" for p, _, d in registry.parameters(fn))
        table.add_row(name.replace("_", "-"), doc, params)
    out.print(table)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 24 else text[:21] + "..."


def run(
    target: Annotated[
        str, typer.Argument(help="A built-in pattern, a .toml scenario or a .py file.")
    ],
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="key=value parameter (repeatable).")
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="Alias, HF dir or hub id.")
    ] = None,
    mode: Annotated[
        str | None, typer.Option(help="choreographed (default), baseline or hf (transformers).")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Seed: a run is then reproducible.")] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write the result(s) here.")
    ] = None,
    inputs: Annotated[
        Path | None, typer.Option(help="JSON lines: one object of inputs per run.")
    ] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Runs at a time with --inputs.")] = 4,
    leak_policy: Annotated[str, typer.Option(help="allow, warn, deny or reencode.")] = "warn",
    dtype: Annotated[
        str, typer.Option(help="auto (default), mixed, float32, bfloat16 or float16.")
    ] = DEFAULT_DTYPE,
    weights: WeightsOpt = "auto",
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    policy: Annotated[
        str,
        typer.Option(
            help="How waiting calls are admitted: fcfs (default), workflow (earlier "
            "workflows first; helps --inputs runs) or objective (latency calls first)."
        ),
    ] = "fcfs",
    trace: Annotated[
        Path | None,
        typer.Option(help="Write a trace (JSON lines) here; view it with `corps trace view`."),
    ] = None,
    otel_endpoint: Annotated[
        str | None,
        typer.Option(
            help="Send each call's span to this OTLP/HTTP collector as the call ends, e.g. "
            "http://localhost:4318/v1/traces (needs pip install 'corps[otel]').",
        ),
    ] = None,
    adapter: Annotated[
        Path | None,
        typer.Option(help="A LoRA adapter directory (PEFT format, e.g. corps distill --out)."),
    ] = None,
    compile: CompileOpt = False,
    compile_gemms: CompileGemmsOpt = "library",
    precompiled: PrecompiledOpt = "auto",
    repair: RepairOpt = None,
    decision_repair: DecisionRepairOpt = None,
    repair_bound: RepairBoundOpt = True,
    audit: AuditOpt = 0,
    audit_budget: AuditBudgetOpt = 0.05,
    live: Annotated[
        bool | None,
        typer.Option(
            "--live/--no-live",
            help="Stream each agent's tokens in panels while it runs (default: on in a terminal).",
        ),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Run the --inputs across N engine workers on Ray (pip install 'corps[ray]'); "
            "--concurrency is then per worker.",
        ),
    ] = None,
    ray_address: Annotated[
        str | None,
        typer.Option(
            "--ray",
            help="With --workers: join this Ray cluster (HOST:PORT, ray://HOST:PORT or auto) "
            "instead of starting a local one.",
        ),
    ] = None,
    gpus_per_worker: Annotated[
        float, typer.Option(min=0, help="With --workers: GPUs each worker takes (0: CPU).")
    ] = 0.0,
    threads_per_worker: Annotated[
        int | None,
        typer.Option(min=1, help="With --workers: torch threads per worker (default: cores / N)."),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            help="With --workers and --json: keep the results already in --json, run the rest."
        ),
    ] = False,
    store: Annotated[
        Path | None,
        typer.Option(help="A directory where the run's messages outlive it (see --run)."),
    ] = None,
    run_name: Annotated[
        str | None,
        typer.Option(
            "--run",
            help="With --store: the run's name. A run of that name already there continues "
            "from its last finished call (the same inputs and --seed replay what it did).",
        ),
    ] = None,
) -> None:
    """Run a workflow and print its answer and a summary (tokens encoded vs reused, ...)."""
    try:
        tgt = resolve(target)
        params = {**tgt.params, **parse_sets(set_ or [])}
        if seed is not None:
            params["seed"] = seed
        lines = read_inputs(inputs) if inputs is not None else None
        _check_worker_flags(workers, lines, json_out, resume, ray_address, gpus_per_worker)
        record = _run_name(store, run_name, lines is not None or workers is not None)
        checked = (
            [tgt.validated({**params, **line}, f"line {i + 1}: ") for i, line in enumerate(lines)]
            if lines is not None
            else [tgt.validated(params)]
        )
        config = EngineConfig.of(  # every engine setting checked before anything loads
            model or tgt.model or DEFAULT_MODEL,
            mode=mode or tgt.mode or "choreographed",
            dtype=dtype,
            weights=weights,
            device=device,
            leak_policy=leak_policy,
            trace=trace,
            otel=otel_endpoint,
            policy=policy,
            adapter=adapter,
            compile=compile,
            compile_gemms=compile_gemms,
            precompiled=precompiled,
            **repair_fields(repair, decision_repair),
            repair_bound=repair_bound,
            audit=audit,
            audit_budget=audit_budget,
            store=store,
        )
        check_adapter_of(config, err)
        if otel_endpoint is not None:
            from corps.engine.trace.exporter import check_available

            check_available(config.otel_protocol)
    except BadConfig as exc:
        _exit(exc.for_cli(), 2)
    except CorpsError as exc:
        _exit(str(exc), 2)
    live = out.is_terminal if live is None else live
    if workers is not None:
        _on_workers(tgt, lines, checked, config, workers, ray_address, gpus_per_worker,
                    threads_per_worker, concurrency, json_out, resume)  # fmt: skip
        return
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", LeakWarning)  # counted in the summary instead
            if lines is None:
                result, audits, summary = anyio.run(_one, tgt, checked[0], config, live, record)
                show(result, tgt, summary)
                if record is not None:
                    out.print(
                        f"recorded in {store} as run {record!r} (--run {record} continues it)"
                    )
                if audits is not None:
                    out.print(audit_table(audits))
                if json_out is not None:
                    json_out.write_text(json.dumps(to_json(result)) + "\n")
            else:
                failed = anyio.run(_many, tgt, checked, config, concurrency, json_out, live)
                if failed:
                    _exit(f"{failed} of {len(checked)} runs failed (see --json)", 1)
    except Exception as exc:  # the workflow's own code may raise anything
        if os.environ.get("CORPS_DEBUG"):
            raise
        _exit(f"workflow failed: {one_line(exc)} ({DEBUG_HINT})", 1)


def _check_worker_flags(workers, lines, json_out, resume, ray_address, gpus) -> None:
    if workers is None:
        given = [f for f, v in (("--ray", ray_address), ("--resume", resume), ("--gpus-per-worker",
                 gpus)) if v]  # fmt: skip
        if given:
            raise ScenarioError(f"{', '.join(given)} only apply with --workers")
        return
    if lines is None:
        raise ScenarioError("--workers runs the lines of --inputs across workers: give --inputs")
    if resume and json_out is None:
        raise ScenarioError("--resume continues the results of --json: give --json")


def _on_workers(tgt, lines, checked, config, workers, address, gpus, threads, concurrency,
                json_out, resume) -> None:  # fmt: skip
    from corps.cli.run_workers import run_on_workers
    from corps.patterns.cluster.errors import ClusterError

    ids = [line.get("id", i) for i, line in enumerate(lines)]
    try:
        failed = run_on_workers(
            tgt, checked, ids, config, workers=workers, address=address, gpus_per_worker=gpus,
            threads_per_worker=threads, concurrency=concurrency, json_out=json_out,
            resume=resume, out=out, err=err,
        )  # fmt: skip
    except ClusterError as exc:
        _exit(str(exc), 2)
    except CorpsError as exc:  # bad inputs (duplicate ids, parameters): nothing ran
        _exit(str(exc), 2)
    if failed:
        _exit(f"{failed} of {len(checked)} runs failed (see --json)", 1)


def read_inputs(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise ScenarioError(f"no inputs file {str(path)!r}")
    lines = []
    for i, raw in enumerate(path.read_text().splitlines()):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except ValueError as exc:
            raise ScenarioError(f"{path} line {i + 1}: not JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise ScenarioError(f"{path} line {i + 1}: expected a JSON object of inputs")
        lines.append(obj)
    if not lines:
        raise ScenarioError(f"{path} has no inputs")
    return lines


def _run_name(store: Path | None, name: str | None, many: bool) -> str | None:
    """The recorded run's name (`--store`, `--run`): given, or a new one; None without
    a store. Only a single run in this process is recorded."""
    if store is None:
        if name is not None:
            raise BadConfig("a run's name needs a store to keep it in: give --store DIR", ("run",))
        return None
    if many:
        raise BadConfig("it records a single run: not with --inputs or --workers", ("store",))
    return name if name is not None else f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


async def _one(
    tgt: Target, params: dict, config: EngineConfig, live: bool, record: str | None = None
) -> Any:
    given = ", ".join(f"{k}={_short(v)}" for k, v in params.items())
    headline = f"{tgt.label}  ·  {given}" if given else tgt.label

    async def body(rt) -> Any:
        if record is None:
            return await tgt.fn(rt, **params)
        with rt.engine.recorded(record):  # calls finished before under this name replay
            return await tgt.fn(rt, **params)

    return await _session(config, live, headline, body)


async def _session(
    config: EngineConfig, live: bool, headline: str, body: Callable[[Any], Awaitable[Any]]
) -> Any:
    """Open the engine and a runtime, `await body(rt)` and return what it returns (its
    exception, if any, as itself) with the engine's audit report (None unless it
    audited: --audit or --repair auto) and a `Summary` of the run from the engine's
    own counters. With `live`, the panels show from before the model
    loads until the run ends, and the last frame stays. With --otel-endpoint, one line
    says, once the engine has closed (its spans flushed), how many spans were taken."""
    from corps.agents import Runtime
    from corps.engine import Engine

    view = None
    if live:
        from corps.view.live import LiveView

        loading = (
            f"loading {config.model} ({config.mode}, dtype {config.dtype}, "
            f"weights {config.weights})…"
        )
        view = LiveView(out, headline, status=loading)
    outcome: list[Any] = []
    engine = audits = summary = None
    async with anyio.create_task_group() as tg:
        if view is not None:
            tg.start_soon(view.run)
        try:
            async with Engine.open(config) as engine, Runtime(engine) as rt:
                if view is not None:
                    view.attach(engine)
                    view.status = "running"
                t0 = time.perf_counter()
                outcome.append(await body(rt))
                summary = Summary.of(engine, time.perf_counter() - t0)
                if config.audit or config.repair.startswith("auto"):
                    audits = await engine.fidelity_report()
        except Exception as exc:  # re-raised below, outside the task group
            outcome.append(exc)
        finally:
            if view is not None:
                view.done()
            tg.cancel_scope.cancel()
    sink = engine.otel if engine is not None else None
    if sink is not None:
        lost = f", {sink.dropped} not taken" if sink.dropped else ""
        err.print(f"otel: sent {sink.sent} spans to {config.otel}{lost}", highlight=False)
    if isinstance(outcome[0], Exception):
        raise outcome[0]
    return outcome[0], audits, summary


async def _many(
    tgt: Target,
    runs: list[dict],
    config: EngineConfig,
    concurrency: int,
    json_out: Path | None,
    live: bool = False,
) -> int:
    results: list[Any] = [None] * len(runs)
    limiter = anyio.CapacityLimiter(concurrency)
    columns = (TextColumn("runs"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    # the live panels replace the progress bar: one live display at a time
    progress_console = Console(file=io.StringIO()) if live else err
    headline = f"{tgt.label}  ·  {len(runs)} inputs, {concurrency} at a time"
    with Progress(*columns, console=progress_console, transient=True) as progress:
        task = progress.add_task("runs", total=len(runs))

        async def all_runs(rt) -> None:
            async def one(i: int) -> None:
                async with limiter:
                    try:
                        results[i] = await tgt.fn(rt, **runs[i])
                    except Exception as exc:  # one run's failure, counted; the rest go on
                        results[i] = exc
                progress.advance(task)

            async with anyio.create_task_group() as tg:
                for i in range(len(runs)):
                    tg.start_soon(one, i)

        _, audits, _ = await _session(config, live, headline, all_runs)
    failed = sum(isinstance(r, Exception) for r in results)
    show_many(results, tgt)
    if audits is not None:
        out.print(audit_table(audits))
    if json_out is not None:
        with json_out.open("w") as f:
            for i, r in enumerate(results):
                if isinstance(r, Exception):
                    f.write(json.dumps(dict(index=i, error=str(r))) + "\n")
                else:
                    f.write(json.dumps(dict(index=i, result=to_json(r))) + "\n")
    return failed
