"""The global KV store: preallocated per-layer K/V for every cached token."""

from __future__ import annotations

import torch
from torch import Tensor

from corps.cache.errors import CacheFullError, require


class KVStore:
    """K (unrotated) and V of every stored token, for all layers, in fixed slots.

    A slot holds one token; which message and logical position it belongs to is
    the message table's business. Slots are handed out from a free list, so the
    tokens of messages decoded in parallel interleave physically.
    """

    def __init__(
        self,
        *,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        # one slot more than the capacity, never handed out: `scratch`
        shape = (num_layers, capacity + 1, num_kv_heads, head_dim)
        # empty, not zeros: a slot is always written before it is read, and untouched
        # pages cost no memory, so a large store costs what it holds.
        self.k = torch.empty(shape, dtype=dtype, device=device)  # (L, S, Hkv, D)
        self.v = torch.empty(shape, dtype=dtype, device=device)  # (L, S, Hkv, D)
        self.capacity = capacity
        # the slot padding rows of a static decode step write to (their K/V are
        # dropped; `corps.engine.model.static_decode`): no message ever holds it
        self.scratch = capacity
        # Lowest slots first: pop() from the end of a descending list.
        self._free: list[int] = list(range(capacity - 1, -1, -1))

    def drop(self) -> None:
        """Give the tensors' memory back (the engine is closing); its bookkeeping stays readable."""
        self.k = self.k[:, :0].clone()  # (L, 0, Hkv, D): keeps dtype, device, shape rank
        self.v = self.v[:, :0].clone()

    @staticmethod
    def bytes_per_token(
        num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.finfo(dtype).bits // 8

    @property
    def bytes_per_slot(self) -> int:
        """Bytes of K and V one slot holds, over all layers."""
        layers, _, heads, dim = self.k.shape
        return self.bytes_per_token(layers, heads, dim, self.k.dtype)

    @property
    def free_slots(self) -> int:
        return len(self._free)

    @property
    def used_slots(self) -> int:
        return self.capacity - len(self._free)

    def alloc(self, n: int, *, request: str = "") -> list[int]:
        """Reserve n slots or raise CacheFullError, taking nothing."""
        if n > len(self._free):
            what = f" for {request}" if request else ""
            raise CacheFullError(
                f"KV store full: {n} token slots needed{what}, {len(self._free)} free of "
                f"capacity {self.capacity}; free unused messages (engine.free) or open the "
                f"engine with a larger capacity"
            )
        return [self._free.pop() for _ in range(n)]

    def release(self, slots: list[int]) -> None:
        self._free.extend(sorted(slots, reverse=True))

    def check(self, owned: list[int]) -> None:
        """BrokenInvariant unless every slot is either free once or in `owned` once
        (the slots messages and the prefix cache hold)."""
        free = self._free
        require(len(free) == len(set(free)), "a store slot is on the free list twice")
        require(len(owned) == len(set(owned)), "a store slot has two owners")
        require(not set(owned) & set(free), "an owned store slot is also free")
        leaked = self.capacity - len(owned) - len(free)
        require(leaked == 0, f"{leaked} store slots leaked")

    def write(self, layer: int, slots: Tensor, k: Tensor, v: Tensor) -> None:
        """Store unrotated k, v (T, Hkv, D) at slots (T,)."""
        self.k[layer].index_copy_(0, slots, k)
        self.v[layer].index_copy_(0, slots, v)

    def copy(self, src: Tensor, dst: Tensor) -> None:
        """Copy every layer's K and V of slots src (T,) into slots dst (T,)."""
        self.k.index_copy_(1, dst, self.k.index_select(1, src))
        self.v.index_copy_(1, dst, self.v.index_select(1, src))
