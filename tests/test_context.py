"""cache/context.py: a placed context held once for all its readers (ContextPool)."""

from __future__ import annotations

import torch

from corps.cache.arena import ViewArena
from corps.cache.context import ContextPool, SharedContext


def _arena() -> ViewArena:
    return ViewArena(num_layers=2, num_kv_heads=1, head_dim=4, capacity=32, dtype=torch.float32)


def test_a_context_is_shared_by_its_readers_and_freed_by_the_last():
    arena, pool = _arena(), ContextPool()
    key = ((3, 4, 5), (0, 1, 2))
    base = arena.alloc(3)
    ctx = SharedContext(
        key, arena.k[:, :, base : base + 3], arena.v[:, :, base : base + 3], arena, base
    )
    pool.add(ctx)
    assert pool.get(key) is ctx and pool.get(((3, 4, 5), (1, 2, 3))) is None
    assert (len(pool), pool.tokens, ctx.refs) == (1, 3, 2)
    k, v = ctx.layer(1)
    assert k.shape == v.shape == (1, 3, 4)
    pool.release(ctx)
    assert len(pool) == 1 and arena.free_tokens == 29  # one reader left
    pool.release(ctx)
    assert (len(pool), pool.tokens, arena.free_tokens) == (0, 0, 32)
    ctx.free()  # idempotent
    assert arena.free_tokens == 32
