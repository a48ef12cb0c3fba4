"""`corps bench tenants`: a light tenant's latency beside a heavy tenant's load."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from corps.cache.errors import CorpsError
from corps.cli.options import DtypeOpt, ModelOpt, fail
from corps.cli.options import bad as _bad
from corps.engine.config import DEFAULT_DTYPE, EngineConfig


def bench_tenants(
    model: ModelOpt = "smollm2-135m",
    dtype: DtypeOpt = DEFAULT_DTYPE,
    streams: Annotated[
        int, typer.Option(min=1, max=512, help="The heavy tenant's streams kept going.")
    ] = 40,
    requests: Annotated[
        int, typer.Option(min=1, max=10_000, help="The light tenant's requests per phase.")
    ] = 30,
    tokens: Annotated[int, typer.Option(min=1, max=4096, help="Tokens per reply.")] = 24,
    modes: Annotated[
        str, typer.Option(help="Comma-separated: choreographed, baseline.")
    ] = "choreographed,baseline",
    policies: Annotated[
        str, typer.Option(help="Comma-separated scheduling policies (fcfs, fair, ...).")
    ] = "fcfs,fair",
    heavy_weight: Annotated[
        float, typer.Option(min=0.001, max=1000, help="The heavy tenant's weight.")
    ] = 1.0,
    shares: Annotated[
        float,
        typer.Option(
            min=0,
            max=3600,
            help="Also this many seconds of a backlog of both "
            "tenants (Python API, 8 slots): each one's service against its weight.",
        ),
    ] = 0.0,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Also write the figures here (JSON).")
    ] = None,
) -> None:
    """A light tenant (one streamed request at a time) alone and beside a heavy tenant
    keeping --streams streams going, over real HTTP (`corps serve` with a key file,
    the openai client): the light tenant's TTFT p50 / p99 and the heavy tenant's
    throughput, alone and together, per mode and policy, side by side. Needs
    corps[serve] and openai."""
    try:
        import openai  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        _bad(f"corps bench tenants needs {exc.name}: pip install 'corps[serve]' openai")
    from corps.bench import tenants as bt

    mode_list = [m.strip() for m in modes.split(",") if m.strip()]
    policy_list = [p.strip() for p in policies.split(",") if p.strip()]
    if not mode_list or not policy_list:
        _bad("--modes and --policies each need one or more names")
    try:
        cfgs = {f"{m} / {p}": EngineConfig.of(model, dtype=dtype, mode=m, policy=p)
                for m in mode_list for p in policy_list}  # fmt: skip
    except CorpsError as exc:
        _bad(str(exc))
    plan = bt.Plan(streams=streams, requests=requests, tokens=tokens, heavy_weight=heavy_weight)
    console = Console()
    settings = []
    try:
        for label, cfg in cfgs.items():
            settings.append(bt.run_setting(cfg, model, label, plan))
            console.print(f"{label}: done", highlight=False)
    except CorpsError as exc:
        fail(exc)
    if shares:
        import anyio

        base = next(iter(cfgs.values()))
        weights = {"light": 1.0, "heavy": heavy_weight}
        got = anyio.run(bt.shares, base, weights, streams, tokens, shares, 8)
        about = f"both tenants backlogged for {shares:g} s ({model}, {streams} streams each)"
        console.print(bt.shares_table(got, about + ", 8 slots"))
    title = (f"a light tenant beside a heavy one over HTTP ({model}, {streams} heavy streams, "
             f"{requests} light requests, {tokens} tokens a reply)")  # fmt: skip
    console.print(bt.table(settings, title))
    if json_out:
        json_out.write_text(json.dumps([bt.summary(s) for s in settings], indent=1) + "\n")
