"""Shared contexts (corps.cache.context): copies in the view arena, and contexts read
from the store."""

from __future__ import annotations

import torch

from corps.cache.arena import ViewArena
from corps.cache.kv import KVStore
from corps.cache.rope import RopeTables
from corps.engine.sampling import SamplingParams

L, HKV, D, S = 3, 2, 8, 64


def _store(seed: int = 0) -> tuple[KVStore, RopeTables]:
    g = torch.Generator().manual_seed(seed)
    store = KVStore(num_layers=L, num_kv_heads=HKV, head_dim=D, capacity=S, dtype=torch.float32)
    store.k.copy_(torch.randn(store.k.shape, generator=g))
    store.v.copy_(torch.randn(store.v.shape, generator=g))
    angles = torch.arange(128.0)[:, None] * torch.rand(D // 2, generator=g)[None]  # (P, D/2)
    rope = RopeTables(angles.cos().repeat(1, 2), angles.sin().repeat(1, 2))
    return store, rope


def _scratch(capacity: int = S) -> ViewArena:
    return ViewArena(
        num_layers=1, num_kv_heads=HKV, head_dim=D, capacity=capacity, dtype=torch.float32
    )


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, ignore_eos=True)
