"""`corps serve`: the OpenAI-compatible server, its options checked before anything loads."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from corps.cache.errors import CorpsError
from corps.cli.options import (
    AuditBudgetOpt,
    AuditOpt,
    DeviceOpt,
    DtypeOpt,
    ModelOpt,
    PrecompiledOpt,
    RepairOpt,
    WeightsOpt,
)
from corps.cli.options import bad as _bad
from corps.engine.config import DEFAULT_DTYPE, EngineConfig


def serve(
    model: ModelOpt = "smollm2-135m",
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(min=0, max=65535)] = 8000,
    mode: Annotated[str, typer.Option(help="choreographed (default) or baseline.")] = (
        "choreographed"
    ),
    dtype: DtypeOpt = DEFAULT_DTYPE,
    weights: WeightsOpt = "auto",
    precompiled: PrecompiledOpt = "auto",
    device: DeviceOpt = "cpu",
    policy: Annotated[
        str,
        typer.Option(
            help="fcfs, workflow, objective or fair; auto (default): fair with a "
            "key file of two or more tenants, else fcfs."
        ),
    ] = "auto",
    leak_policy: Annotated[str, typer.Option(help="allow, warn, deny or reencode.")] = "warn",
    trace: Annotated[Path | None, typer.Option(help="Write a trace (JSON lines) here.")] = None,
    otel_endpoint: Annotated[
        str | None, typer.Option(help="Send each call's span to this OTLP collector.")
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(help="Require `Authorization: Bearer KEY` on /v1/ (default: none)."),
    ] = None,
    keys: Annotated[
        Path | None,
        typer.Option(help="A TOML key file: each API key's tenant and agents (docs/serve.md)."),
    ] = None,
    max_body: Annotated[
        int, typer.Option(min=1024, help="Largest request body in bytes (413 past it).")
    ] = 4 << 20,
    max_queue: Annotated[
        int, typer.Option(min=1, help="Requests answered at once (429 past it).")
    ] = 256,
    max_prompt_tokens: Annotated[
        int | None, typer.Option(min=1, help="Longest prompt (default: the context length).")
    ] = None,
    request_timeout: Annotated[
        float, typer.Option(min=0.001, help="Seconds one request, a stream included, may take.")
    ] = 600.0,
    shutdown_grace: Annotated[
        float, typer.Option(min=0.001, help="Seconds SIGTERM waits for requests to finish.")
    ] = 30.0,
    keep_messages: Annotated[
        int, typer.Option(min=0, help="Encoded messages kept for resends and ids (LRU).")
    ] = 4096,
    tenant_metrics: Annotated[
        bool, typer.Option(help="/metrics: a series per tenant, named as in the key file.")
    ] = False,
    store: Annotated[
        Path | None,
        typer.Option(help="A directory where messages and their ids outlive the server."),
    ] = None,
    repair: RepairOpt = "none",
    audit: AuditOpt = 0,
    audit_budget: AuditBudgetOpt = 0.05,
) -> None:
    """An OpenAI-compatible API (/v1/chat/completions, /v1/completions, /v1/models,
    /health, /metrics) over one engine; messages by id as an extension. Needs
    pip install 'corps[serve]'."""
    try:
        import uvicorn

        from corps.serve.app import create_app
        from corps.serve.limits import Limits
        from corps.serve.principals import Keys
    except ImportError as exc:
        _bad(f"corps serve needs its extra: pip install 'corps[serve]' ({exc.name} is missing)")
    from corps.engine import Engine

    if keys is not None and api_key is not None:
        _bad("--keys and --api-key: give one (a key file can hold the single key too)")
    try:
        ring = Keys.load(keys) if keys is not None else None
    except ValueError as exc:
        _bad(f"--keys: {exc}")
    limits = Limits(max_body, max_queue, request_timeout, max_prompt_tokens, shutdown_grace,
                    keep_messages)  # fmt: skip
    if policy.strip().lower() == "auto":
        policy = "fair" if ring is not None and len(ring.weights()) > 1 else "fcfs"
    elif ring is not None and policy.strip().lower() != "fair" and ring.weighted():
        _bad(f"--keys gives tenants weights, which only --policy fair reads (not {policy!r})")

    try:
        cfg = EngineConfig.of(
            model, mode=mode, dtype=dtype, weights=weights, device=device, policy=policy,
            leak_policy=leak_policy, trace=trace, otel=otel_endpoint, repair=repair, audit=audit,
            audit_budget=audit_budget, precompiled=precompiled, store=store,
        )  # fmt: skip
    except CorpsError as exc:
        _bad(str(exc))
    if cfg.mode == "hf":
        _bad("--mode: corps serve runs choreographed or baseline")
    app_ = create_app(Engine.open(cfg), model=model, api_key=api_key, keys=ring, limits=limits,
                      tenant_metrics=tenant_metrics)  # fmt: skip
    uvicorn.run(app_, host=host, port=port, log_level="warning",
                timeout_graceful_shutdown=shutdown_grace)  # fmt: skip
