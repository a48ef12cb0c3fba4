"""Building an engine's executor from its config: the one place weights are loaded."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from corps.cache.errors import InvalidRequest
from corps.cache.kv import KVStore
from corps.engine.api.durable import open_store
from corps.engine.api.precompile import idle, spawn_build
from corps.engine.attention import select_backend
from corps.engine.config import DEFAULT_MAX_CAPACITY, DEFAULT_MEMORY_BUDGET, EngineConfig
from corps.engine.exec.executor import Executor
from corps.engine.exec.kv_executor import KVExecutor
from corps.engine.model.adapter_files import check_for_model, read_scope
from corps.engine.model.names import corps_home, resolve_model
from corps.engine.model.tuning import KernelChoice, measure, rows_within, weight_format
from corps.engine.model.weights import (
    load_hf,
    load_weights,
    read_spec,
    torch_dtype,
    weight_source,
)
from corps.engine.repair import parse_repair
from corps.engine.sched.cost import StepCost
from corps.engine.sched.policies import LATENCY_SLOWDOWN


def build_executor(cfg: EngineConfig, console: Console | None = None) -> Executor:
    """Resolve (and if needed fetch) the model, load it, and build the executor of
    `cfg.mode`: `KVExecutor` over our KV store, or `HFExecutor` for "hf". Blocks."""
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise InvalidRequest(f"device {cfg.device!r} asked for, but torch sees no CUDA device")
    attention = select_backend(cfg.device, cfg.attention)  # checks Triton before loading
    path = resolve_model(cfg.model, console=console)
    spec = read_spec(path)
    if cfg.adapter is not None:  # a bad adapter fails before the weights load
        check_for_model(path, cfg.adapter)
    # on CUDA without a budget the store takes a share of what the weights leave free
    by_free = cfg.device.startswith("cuda") and not (cfg.capacity or cfg.memory_budget)
    capacity = cfg.capacity or (0 if by_free else capacity_for(cfg, spec))
    from transformers import AutoTokenizer

    dtype = torch_dtype(cfg.dtype)
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    if cfg.mode == "hf":  # reference: transformers generate, one call at a time
        from corps.engine.exec.hf import HFExecutor

        # it re-encodes every prompt as text: no context is rewired, so an adapter of
        # scope "rewired" never applies
        merged = cfg.adapter if cfg.adapter and read_scope(cfg.adapter) == "all" else None
        hf = load_hf(path, dtype=dtype, adapter=merged, device=cfg.device).to(cfg.device)
        executor = HFExecutor(hf, tokenizer, spec, model_path=path, precision=cfg.dtype)
    else:
        source = weight_source(cfg.weights, path, cfg.adapter)
        # quantized projections run their own kernel: no dense kernel to time or choose
        mixed, choice = _weight_format(cfg, spec, console) if source == "dense" else (False, None)
        weights = load_weights(
            path,
            dtype=dtype,
            device=cfg.device,
            mixed=mixed,
            choice=choice,
            adapter=cfg.adapter,
            # only choreographed calls read rewired contexts
            adapter_copy=cfg.adapter_copy and cfg.mode == "choreographed",
            weights=source,
        )
        if by_free:
            free, _ = torch.cuda.mem_get_info(torch.device(cfg.device))
            capacity = capacity_of_free(free, slot_bytes(cfg, spec), cfg.memory_fraction)
        if cfg.compile and console is not None:
            console.print(
                "[dim]compiling the one-row decode step (torch.compile, once per engine)[/]"
            )
        executor = KVExecutor(
            weights,
            tokenizer,
            model_path=path,
            mode=cfg.mode,
            capacity=capacity,
            precision=cfg.dtype,
            contexts=cfg.contexts,
            attention=attention,
            jump_forward=cfg.jump_forward,
            repair=parse_repair(cfg.repair),
            repair_bound=cfg.repair_bound,
            graphs=graphs_of(cfg),
            compile_gemms=cfg.compile_gemms if cfg.compile else None,
            kernel_choice=choice,
            step_cache=None if cfg.precompiled == "off" else corps_home() / "steps",
            build_step=cfg.precompiled == "build",
        )
        if cfg.store is not None:  # its messages back before the engine starts
            open_store(cfg, path, source, executor)
        if executor.step_missing is not None and cfg.precompiled == "auto":
            spawn_build(cfg, executor.step_missing, console)
    return executor


def graphs_of(cfg: EngineConfig) -> str:
    """How the engine of `cfg` runs decode-only steps: "capture", "static" or "off"
    ("auto": capture on CUDA, off elsewhere)."""
    if cfg.graphs != "auto":
        return cfg.graphs
    return "capture" if cfg.device.startswith("cuda") else "off"


def _weight_format(
    cfg: EngineConfig, spec, console: Console | None
) -> tuple[bool, KernelChoice | None]:
    """`tuning.weight_format` of the config: dtype="auto" on a CPU times the kernels
    once per machine (cached under $CORPS_HOME/kernels), saying so on the console."""
    cache = corps_home() / "kernels"

    def timed(*args, **kw):
        if console is not None:
            console.print(f"[dim]timing product kernels on this CPU, once ({cache})[/]")
        return measure(*args, **kw)

    return weight_format(cfg.dtype, spec, cfg.device, cache, measure_fn=timed)


def slot_bytes(cfg: EngineConfig, spec) -> int:
    """Bytes one token slot costs: the store and a view arena of the same size (and
    with contexts="store" a one-layer scratch as long), so twice and a bit
    (`stats().kv_bytes` is what the slots bought, never more)."""
    per_token = KVStore.bytes_per_token(
        spec.num_layers, spec.num_kv_heads, spec.head_dim, torch_dtype(cfg.dtype)
    )
    return 2 * per_token + (per_token // spec.num_layers if cfg.contexts == "store" else 0)


def capacity_of_free(free: int, per_slot: int, fraction: float) -> int:
    """Store slots for `fraction` of `free` device bytes (at least 256: a device
    too full for those fails when they are allocated, saying so)."""
    return max(256, int(free * fraction) // per_slot)


def capacity_for(cfg: EngineConfig, spec) -> int:
    """Store slots `cfg.memory_budget` buys (the default budget when None)."""
    per_slot = slot_bytes(cfg, spec)
    if cfg.memory_budget is None:  # default: 2 GiB, at most DEFAULT_MAX_CAPACITY slots
        return max(1024, min(DEFAULT_MAX_CAPACITY, DEFAULT_MEMORY_BUDGET // per_slot))
    capacity = cfg.memory_budget // per_slot
    if capacity < 256:
        raise InvalidRequest(
            f"memory_budget={cfg.memory_budget} bytes buys {capacity} token slots "
            f"(store and views, {per_slot} bytes per slot); give at least {256 * per_slot}"
        )
    return capacity


def measured_settings(policy: str, executor: Executor) -> dict[str, Any]:
    """The objective policy's step bounds from the executor's measured kernels
    (`executor.kernel_choice`, dtype auto on CPU), if any:
    the rows a step holds before it has learnt its cost, and the measured products'
    seconds as the step cost's measure of rows."""
    choice = getattr(executor, "kernel_choice", None)
    if policy != "objective" or choice is None:
        return {}
    return dict(
        latency_rows=rows_within(choice, LATENCY_SLOWDOWN),
        cost=StepCost(products=choice.products),
    )


def build_in_background(lock: str, config: str) -> int:
    """The background build of `precompile.spawn_build`: open `config` (an
    EngineConfig's JSON, precompiled="build") at the lowest priority, which builds
    its decode step's package, and exit; the lock goes either way."""
    try:
        idle()
        cfg = EngineConfig.model_validate_json(config)
        t0 = time.perf_counter()
        executor = build_executor(cfg)
        print(f"built in {time.perf_counter() - t0:.1f} s", flush=True)
        executor.close()
        return 0
    finally:
        Path(lock).unlink(missing_ok=True)
