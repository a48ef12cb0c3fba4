"""`engine_stats`: an executor's `EngineStats`, read from the parts that hold each figure."""

from __future__ import annotations

from corps.engine.exec.counts import Counts
from corps.engine.exec.grammars import Grammars
from corps.engine.exec.memory import Memory
from corps.engine.model.runner import ModelRunner
from corps.engine.repair import Repair
from corps.engine.stats import EngineStats


def engine_stats(
    mode: str,
    memory: Memory,
    runner: ModelRunner,
    grammars: Grammars,
    counts: Counts,
    *,
    messages: int,
    contexts: str,
    repair: Repair,
) -> EngineStats:
    """What the engine holds and has done (`Engine.stats`, less the loop's figures)."""
    store, prefixes = memory.store, memory.prefixes
    radix = prefixes.radix if prefixes is not None else None
    graph, static = runner.compiled, runner.static
    return EngineStats(
        mode=mode,
        capacity=store.capacity,
        tokens_used=store.used_slots,
        tokens_free=store.free_slots,
        messages=messages,
        tokens_encoded=counts.tokens_encoded,
        tokens_reused=counts.tokens_reused,
        tokens_jumped=counts.tokens_jumped,
        constraints_compiled=len(grammars.compile_seconds),
        constraint_compile_s=sum(grammars.compile_seconds.values()),
        prefix_hit_tokens=radix.hit_tokens if radix else 0,
        prefix_query_tokens=radix.query_tokens if radix else 0,
        prefix_shared_in_batch=prefixes.shared_in_batch if prefixes else 0,
        view_tokens=memory.view_tokens,
        view_tokens_peak=memory.view_tokens_peak,
        view_capacity=memory.arena.capacity,
        kv_bytes=memory.kv_bytes,
        contexts=contexts,
        scratch_tokens=memory.scratch_tokens,
        scratch_tokens_peak=memory.scratch_tokens_peak,
        layers=store.k.shape[0],
        weight_bytes=runner.weight_bytes,
        forward_s=counts.forward_seconds,
        compiled_steps=sum(graph.steps.values()) if graph else 0,
        static_steps=static.runs if static else 0,
        graphs_captured=sum(s.graph is not None for s in static.steps.values()) if static else 0,
        graph_capture_s=static.capture_seconds if static else 0.0,
        step_compile_s=graph.compile_seconds if graph else 0.0,
        messages_evicted=memory.messages_evicted,
        tokens_evicted=memory.tokens_evicted,
        tokens_recomputed=counts.tokens_recomputed,
        tokens_copied_back=memory.tokens_copied_back,
        tokens_prefetched=memory.tokens_prefetched,
        tokens_spilled=memory.spilled(),
        tokens_in_host=memory.in_host(),
        tokens_repaired=counts.tokens_repaired,
        tokens_probed=counts.tokens_probed,
        repair=str(repair),
    )
