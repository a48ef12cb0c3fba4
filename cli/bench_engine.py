"""`corps bench` over the engine's parts: adapters, the runner, batching, the
step's host time, ops, memory, kernels."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from corps.cache.errors import CorpsError
from corps.cli.bench_options import (
    run_bench,
    stream_counts,
)
from corps.cli.options import (
    DtypeOpt,
    ModelOpt,
    WeightsOpt,
    dtype_option,
    err,
    fail,
)
from corps.cli.options import bad as _bad
from corps.engine.config import DEFAULT_DTYPE, BadConfig, EngineConfig
from corps.engine.model.adapter_files import check_adapter_of


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

    counts = stream_counts(streams)
    try:
        main(model, dtype, counts, tokens, rounds, weights)
    except CorpsError as exc:
        fail(exc)


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

    counts = stream_counts(streams)
    aheads = stream_counts(run_ahead, "--run-ahead")
    try:
        main(model, tokens, rounds, counts, aheads, top_logprobs, dtype=dtype)
    except CorpsError as exc:
        fail(exc)


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

    adm, ctx, long, decodes = run_bench(all_three)
    Console().print(*bm.tables(adm, ctx, long, decodes))


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


def bench_evict(
    workflows: Annotated[int, typer.Option(min=2, help="Workflows at once.")] = 6,
    rounds: Annotated[int, typer.Option(min=1, help="Turns of each person's workflow.")] = 3,
    pace: Annotated[int, typer.Option(min=1, help="Agents' turns per person's turn.")] = 2,
    doc: Annotated[int, typer.Option(min=1, help="Words of each workflow's document.")] = 128,
    tool: Annotated[int, typer.Option(min=1, help="Words of each turn's tool output.")] = 64,
    max_tokens: Annotated[int, typer.Option(min=1, help="Tokens of each reply.")] = 8,
    room: Annotated[
        float,
        typer.Option(
            min=1.0, help="Store: this x every document and reply kept, plus a turn of each."
        ),
    ] = 1.0,
    model: ModelOpt = "smollm2-135m",
    dtype: Annotated[str, typer.Option(callback=dtype_option)] = "auto",
) -> None:
    """Eviction by workflows' next reads (`Engine.expect`) against LRU: many workflows
    over one small store, without and with a store directory (restores recompute or
    copy back): tokens restored and wall time side by side."""
    from corps.bench import evict as be

    arms = run_bench(lambda: be.compare(model, dtype, workflows, rounds, pace, doc, tool,
                                        max_tokens, room))  # fmt: skip
    note = f"{workflows} workflows, {rounds} x {pace} turns, room {room}"
    Console(width=max(150, Console().width)).print(be.table(arms, note))


def _cpu_kernels(model: str, remeasure: bool) -> None:
    from corps.bench import kernels as bk
    from corps.engine.model.names import resolve_model

    table, fresh = bk.cpu_kernels(resolve_model(model, console=err), remeasure)
    Console(width=max(150, Console().width)).print(table)
    if fresh:
        Console().print("[dim](timed now; later loads read the cache)[/]")


def bench_store(
    contexts: Annotated[int, typer.Option(min=1, help="Contexts kept in the store.")] = 8,
    tokens: Annotated[int, typer.Option(min=8, help="Tokens of each context.")] = 512,
    model: ModelOpt = "smollm2-135m",
    dtype: Annotated[str, typer.Option(callback=dtype_option)] = "auto",
) -> None:
    """A store's restart and tier (`--store`): follow-ups after a restart with encodings
    copied in, lost, or no store at all; evicted encodings recomputed vs copied back."""
    from corps.bench import store as bs

    async def both():
        restarts = await bs.restart(model, contexts, tokens, dtype)
        return restarts, await bs.tier(model, contexts, tokens, dtype)

    restarts, tiers = run_bench(both)
    Console().print(*bs.tables(restarts, tiers))
