"""A call's rotated view of the store: the context one in-flight call attends to.

Design (repositioning and concurrency): the global store keeps keys unrotated.
When a call starts, the keys of its parents are gathered and rotated to the
logical positions *this call* gives them, into a contiguous buffer owned by the
call; the call's own new tokens are appended to it as they are encoded. So:

- two concurrent calls placing the same parent at different offsets each see
  correctly rotated keys, and neither mutates what the other reads;
- the per-step attention cost follows the call's own context, never the size
  of the store (the gather is done once per call, not per step);
- the store holds exactly one canonical copy per token.

The price is one copy of the context per in-flight call, made once (a memcpy,
far cheaper than re-encoding those tokens).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from corps.cache.arena import ViewArena
from corps.cache.kv import KVStore
from corps.cache.rope import RopeTables


class CallView:
    """Rotated K and V of one call's context plus its own tokens so far."""

    def __init__(
        self,
        k: Tensor,
        v: Tensor,
        length: int,
        arena: ViewArena | None = None,
        base: int = 0,
    ) -> None:
        self.k = k  # (L, Hkv, cap, D), rotated; head-major so each head's keys are contiguous
        self.v = v  # (L, Hkv, cap, D)
        self.length = length  # tokens filled so far
        self.k_layers = k.unbind(0)  # per layer (Hkv, cap, D), made once: decode steps are hot
        self.v_layers = v.unbind(0)
        self.arena = arena  # k, v are arena.k/v[:, :, base : base + cap] when set
        self.base = base

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    @classmethod
    def gather(
        cls,
        store: KVStore,
        rope: RopeTables,
        slots: Tensor,
        positions: Tensor,
        extra: int,
        arena: ViewArena | None = None,
        fill: Callable[..., None] | None = None,
    ) -> CallView:
        """View of `slots` (C,) placed at `positions` (C,), with room for `extra` new tokens.

        Carved from `arena` when it has room, else standalone. `fill(store_k, store_v,
        slots, positions, cos, sin, out_k, out_v)` does the gather when given (an
        attention backend's kernel); else plain torch ops do.
        """
        n_ctx = int(slots.numel())
        layers, _, heads, dim = store.k.shape
        cap = n_ctx + extra
        base = arena.alloc(cap) if arena is not None else None
        if base is not None:
            k, v = arena.k[:, :, base : base + cap], arena.v[:, :, base : base + cap]
        else:
            shape = (layers, heads, cap, dim)
            k = torch.empty(shape, dtype=store.k.dtype, device=store.k.device)
            v = torch.empty(shape, dtype=store.v.dtype, device=store.v.device)
        try:
            if n_ctx and fill is not None:
                fill(store.k, store.v, slots, positions, rope.cos, rope.sin, k, v)
            elif n_ctx:
                rotated = rope.rotate(store.k[:, slots], positions)  # (L, C, Hkv, D)
                k[:, :, :n_ctx] = rotated.transpose(1, 2)
                v[:, :, :n_ctx] = store.v[:, slots].transpose(1, 2)
        except BaseException:
            if base is not None:  # a failed gather gives its arena range back
                arena.release(base, cap)
            raise
        return cls(k, v, n_ctx, arena if base is not None else None, base or 0)

    def release(self) -> None:
        """Give an arena range back (idempotent; standalone views are garbage collected)."""
        if self.arena is not None:
            self.arena.release(self.base, self.capacity)
            self.arena = None

    def append(self, layer: int, k_rot: Tensor, v: Tensor) -> None:
        """Write t new rotated keys and values (t, Hkv, D) after the current length.

        The length itself advances once per forward step, in `advance`.
        """
        t, n = k_rot.shape[0], self.length
        if t == 1:
            self.k_layers[layer][:, n].copy_(k_rot[0])
            self.v_layers[layer][:, n].copy_(v[0])
        else:
            self.k_layers[layer][:, n : n + t] = k_rot.transpose(0, 1)
            self.v_layers[layer][:, n : n + t] = v.transpose(0, 1)

    def advance(self, t: int) -> None:
        self.length += t
