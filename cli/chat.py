"""`corps chat`: ask one question and stream the answer to the terminal."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from corps.cache.errors import CorpsError
from corps.cli.options import DeviceOpt, DtypeOpt, ModelOpt, PrecompiledOpt, WeightsOpt, err, fail
from corps.cli.options import bad as _bad
from corps.cli.run import CompileGemmsOpt, CompileOpt
from corps.engine.config import DEFAULT_DTYPE, BadConfig, EngineConfig
from corps.engine.model.adapter_files import check_adapter_of


def chat(
    question: Annotated[str, typer.Argument(help="What to ask.")],
    model: ModelOpt = "smollm2-135m",
    system: Annotated[str | None, typer.Option(help="System prompt (none by default).")] = None,
    max_tokens: Annotated[int, typer.Option(min=1)] = 256,
    temperature: Annotated[float, typer.Option(min=0.0, help="0 is greedy.")] = 0.0,
    top_p: Annotated[float, typer.Option(min=0.0, max=1.0)] = 1.0,
    seed: Annotated[int | None, typer.Option(help="Seed for reproducible sampling.")] = None,
    mode: Annotated[str, typer.Option(help="choreographed, baseline or hf.")] = "choreographed",
    dtype: DtypeOpt = DEFAULT_DTYPE,
    weights: WeightsOpt = "auto",
    device: DeviceOpt = "cpu",
    adapter: Annotated[
        Path | None, typer.Option(help="A LoRA adapter directory (PEFT format) to serve with.")
    ] = None,
    compile: CompileOpt = False,
    compile_gemms: CompileGemmsOpt = "library",
    precompiled: PrecompiledOpt = "auto",
) -> None:
    """Ask one question and stream the answer to the terminal."""
    import anyio

    try:  # before loading anything
        config = EngineConfig.of(
            model,
            mode=mode,
            dtype=dtype,
            weights=weights,
            device=device,
            adapter=adapter,
            compile=compile,
            compile_gemms=compile_gemms,
            precompiled=precompiled,
        )
        check_adapter_of(config, err)
    except BadConfig as exc:
        _bad(exc.for_cli())
    except CorpsError as exc:
        _bad(str(exc))

    from corps.engine import Engine

    async def run() -> None:
        async with Engine.open(config) as engine:
            parents = []
            if system:
                parents.append(await engine.prefill(system, role="system"))
            parents.append(await engine.prefill(question, role="user", parents=parents))
            stream = engine.stream(
                parents=parents,
                max_tokens=max_tokens,
                temperature=temperature,
                top_p=top_p,
                seed=seed,
            )
            async for delta in stream:
                sys.stdout.write(delta)
                sys.stdout.flush()
            sys.stdout.write("\n")

    try:
        anyio.run(run)
    except CorpsError as exc:
        fail(exc)
