"""`corps bench` on a GPU's questions: the per-phase account, the device check's
sections, and corps against llama.cpp on one GGUF."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from corps.cache.errors import CorpsError
from corps.cli.bench_options import (
    GPU_SECTIONS,
    GPU_WORKFLOWS,
    pattern_names,
    run_bench,
)
from corps.cli.options import (
    DtypeOpt,
    ModelOpt,
    WeightsOpt,
    err,
    fail,
)
from corps.cli.options import bad as _bad
from corps.engine.config import DEFAULT_DTYPE, BadConfig, EngineConfig


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

    names = pattern_names(patterns)
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
        str, typer.Option(help="Comma-separated, of: " + ", ".join(GPU_WORKFLOWS))
    ] = ",".join(GPU_WORKFLOWS),
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
        str, typer.Option(help="Comma-separated, of: " + ", ".join(GPU_SECTIONS))
    ] = ",".join(GPU_SECTIONS),
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
    from corps.bench import gpu_figures as gf

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    chosen = tuple(w.strip().replace("-", "_") for w in workflows.split(",") if w.strip())
    unknown = [w for w in chosen if w not in gf.WORKFLOWS]
    if unknown:
        _bad(f"--workflows: unknown {', '.join(unknown)}; pick of {', '.join(gf.WORKFLOWS)}")
    picked = tuple(x.strip() for x in sections.split(",") if x.strip())
    unknown = [x for x in picked if x not in gf.SECTIONS]
    if unknown:
        _bad(f"--sections: unknown {', '.join(unknown)}; pick of {', '.join(gf.SECTIONS)}")
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
    settings = gf.Settings(
        model=model, dtype=dtype, weights=weights, device=device, prompt_tokens=prompt_tokens,
        spans=spans,
        span_tokens=span_tokens, context_tokens=context_tokens, decode_tokens=decode_tokens,
        streams=counts, stream_tokens=stream_tokens, workflows=chosen,
        workflow_tokens=workflow_tokens, runs=runs, repeats=repeats, graphs=graphs,
        sections=picked, engines=engines, patterns=pattern_names(patterns),
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
        stream, result = run_bench(
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
