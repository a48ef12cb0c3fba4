"""engine/api/build.py: an engine's executor and memory from its config."""

from __future__ import annotations

import pytest
import torch

from corps.cache import InvalidRequest


async def test_default_capacity_is_capped_and_memory_goes_back_on_close(tiny_dirs):

    from corps.cache.kv import KVStore
    from corps.engine.api.engine import Engine
    from corps.engine.config import DEFAULT_MAX_CAPACITY
    from corps.engine.model.weights import read_spec

    spec = read_spec(tiny_dirs["llama"])
    per_token = KVStore.bytes_per_token(
        spec.num_layers, spec.num_kv_heads, spec.head_dim, torch.float32
    )
    assert (1 << 30) // per_token > DEFAULT_MAX_CAPACITY  # the cap matters for this model
    engine = Engine.load(str(tiny_dirs["llama"]))
    assert engine.stats().capacity == DEFAULT_MAX_CAPACITY
    budget = 4096 * per_token  # an explicit budget is honoured, cap or not: store + views
    stats = Engine.load(str(tiny_dirs["llama"]), memory_budget=budget).stats()
    assert stats.capacity == stats.view_capacity == 2048 and stats.kv_bytes == budget
    with pytest.raises(InvalidRequest, match="memory_budget"):
        Engine.load(str(tiny_dirs["llama"]), memory_budget=100 * per_token)
    async with engine:
        h = await engine.prefill("kept in the store", role="user")
        assert engine.stats().tokens_used == h.length
    # Closed: the store and the arena hold no token memory, even though `engine` and
    # `h` are still referenced.
    assert h.text == "kept in the store"
    core = engine.executor
    assert core.memory.store.k.numel() == core.memory.store.v.numel() == 0
    assert core.memory.arena.k.numel() == core.memory.arena.v.numel() == 0


def test_on_cuda_the_store_takes_a_share_of_what_the_weights_leave_free(tiny_dirs):
    """The sizing rule (the GPU itself is checked by `corps bench gpu`): `fraction` of
    the free bytes over what one slot costs, never below 256 slots."""
    from corps.engine.api.build import capacity_of_free, slot_bytes
    from corps.engine.config import EngineConfig
    from corps.engine.model.weights import read_spec

    spec = read_spec(tiny_dirs["llama"])
    per_slot = slot_bytes(EngineConfig.of(dtype="bfloat16"), spec)
    assert per_slot == 2 * spec.num_layers * 2 * spec.num_kv_heads * spec.head_dim * 2
    assert capacity_of_free(10_000 * per_slot, per_slot, 0.9) == 9000
    assert capacity_of_free(10 * per_slot, per_slot, 0.9) == 256
    with pytest.raises(Exception, match="memory_fraction"):
        EngineConfig.of(memory_fraction=1.5)
