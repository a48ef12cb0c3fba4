"""A call's view of the store: building it at admission, and contexts read in place.

The store keeps keys unrotated. When a call is admitted, `open_view` gives it a
`CallView` (`corps.cache.view`): its context rotated to the positions *this call*
gives it, plus room for its own new tokens. A context is built once and shared
by every concurrent call that places the same slots at the same positions
(`corps.cache.context.ContextPool`). Two kinds, per engine (`contexts=`):

- "copy": the rotated K and V are gathered once into the view arena by the
  backend's `gather` (a Triton kernel on CUDA, `gather_rotate_ref` otherwise);
- "store": nothing is copied; `StoreContext` reads the context from the store at
  every step, rotating its keys one layer at a time into a one-layer scratch.

Both answer `layer(l) -> (k, v)`, each (Hkv, C, D), which is all attention reads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from corps.cache.arena import ViewArena
from corps.cache.context import ContextKey, ContextPool, SharedContext
from corps.cache.errors import ViewsFull
from corps.cache.kv import KVStore
from corps.cache.rope import RopeTables, rope_into
from corps.cache.view import CallView, carve, let_go
from corps.engine.kernels.gather_rotate import gather_rotate_ref


def open_view(
    store: KVStore,
    rope: RopeTables,
    slots: Sequence[int] | Tensor,
    positions: Sequence[int] | Tensor,
    extra: int,
    arena: ViewArena | None = None,
    fill: Callable[..., None] | None = None,
    pool: ContextPool | None = None,
    scratch: ViewArena | None = None,
    tag: tuple = (),
) -> CallView:
    """View of `slots` (C,) placed at `positions` (C,), with room for `extra` new tokens.

    With a `pool`, a live context with the same slots and positions is shared
    instead of rebuilt. Parts are carved from `arena` (ViewsFull when it has no
    room: views never spill outside it); without an arena they are standalone.
    `fill(store_k, store_v, slots, positions, cos, sin, out_k, out_v)` does the
    gather when given (an attention backend's kernel); else plain torch.

    With a `scratch` (a one-layer arena), the context is not copied at all:
    attention reads it from the store (`StoreContext`), and only the own part
    is carved from `arena`. `tag` keeps apart contexts over the same slots and
    positions whose contents differ (a repair's, `ContextKey`). The view is
    `built` when it made its context (its first reader) rather than joined one.
    """
    key = context_key(slots, positions, tag) if pool is not None and len(slots) else None
    dev = store.k.device
    slots = torch.as_tensor(slots, dtype=torch.long, device=dev)  # (C,)
    positions = torch.as_tensor(positions, dtype=torch.long, device=dev)  # (C,)
    n_ctx = int(slots.numel())
    shared = pool.get(key) if key is not None else None
    built = shared is None
    if shared is None and scratch is not None and n_ctx:
        shared = StoreContext(key, store, rope, slots, positions, scratch)
        if key is not None:  # (without a pool it has this one reader, counted nowhere)
            pool.add(shared)
    if shared is not None:
        try:
            k, v, base = carve(store, arena, extra)
        except BaseException:
            let_go(shared, pool)
            raise
        into = arena if base is not None else None
        return CallView(shared, k, v, into, base or 0, pool=pool, built=built)
    k, v, base = carve(store, arena, n_ctx + extra)
    try:
        if n_ctx:
            gather = fill or gather_rotate_ref  # the backend's kernel, or the torch one
            gather(store.k, store.v, slots, positions, rope.cos, rope.sin, k, v)
    except BaseException:
        if base is not None:  # a failed gather gives its arena range back
            arena.release(base, n_ctx + extra)
        raise
    into = arena if base is not None else None
    ctx = None
    if n_ctx:
        ctx = SharedContext(key, k[:, :, :n_ctx], v[:, :, :n_ctx], into, base or 0)
        if key is not None:
            pool.add(ctx)
    own_k, own_v = k[:, :, n_ctx:], v[:, :, n_ctx:]
    own_base = (base or 0) + n_ctx
    return CallView(ctx, own_k, own_v, into, own_base, whole=(k, v), pool=pool, built=True)


def context_key(slots: Sequence[int] | Tensor, positions: Sequence[int] | Tensor, tag: tuple = ()):
    """The `ContextKey` of `slots` placed at `positions` under `tag`."""
    return (tuple(_ints(slots)), tuple(_ints(positions)), tag)


class StoreContext:
    """A placed context that attention reads from the store: keys rotated one layer
    at a time into a scratch range, values in place. Nothing is copied per reader,
    nor per context beyond one layer."""

    in_store = True
    view_tokens = 0  # holds nothing in the view arena
    arena = None  # so a view over it is never one arena range
    base = 0

    def __init__(
        self,
        key: ContextKey | None,
        store,
        rope: RopeTables,
        slots: Tensor,
        positions: Tensor,
        scratch: ViewArena,
    ) -> None:
        c = int(slots.numel())
        base = scratch.alloc(c)
        if base is None:
            raise ViewsFull(
                f"the context scratch has no free range of {c} tokens ({scratch.free_tokens} "
                f"free of {scratch.capacity}); the call waits for running calls to finish"
            )
        self.key = key
        self.store = store  # corps.cache.kv.KVStore, K unrotated
        self.scratch: ViewArena | None = scratch
        self.scratch_base = base
        self._k = scratch.k[0, :, base : base + c]  # (Hkv, C, D) this layer's rotated keys
        self._v_buf = scratch.v[0, :, base : base + c]  # (Hkv, C, D) gathered values, if needed
        self.cos = rope.cos[positions][None]  # (1, C, D): picked once, for every layer
        self.sin = rope.sin[positions][None]
        first = int(slots[0]) if c else 0
        run = c and bool((slots == torch.arange(first, first + c, device=slots.device)).all())
        self.first = first if run else None  # the slots are first .. first + C - 1
        self.slots = slots  # (C,)
        self._c = c
        self._layer = -1  # the layer whose keys _k holds now
        self._v: Tensor = self._v_buf
        self.refs = 0
        self.writer = None  # never rewritten: a repair needs a copy of its own
        self.awaited = False

    @property
    def length(self) -> int:
        return self._c

    def layer(self, layer: int) -> tuple[Tensor, Tensor]:
        """Rotated keys and values of one layer, (Hkv, C, D) each: built when a step
        first asks for this layer (the slots cannot change while readers live, so
        every reader of the layer in a step shares it)."""
        if self._layer != layer:
            self._k, self._v = self._build(layer)
            self._layer = layer
        return self._k, self._v

    def _build(self, layer: int) -> tuple[Tensor, Tensor]:
        sk, sv, c = self.store.k[layer], self.store.v[layer], self._c  # (S, Hkv, D)
        if self.first is not None:  # one run of slots: read in place, head-major
            k = sk[self.first : self.first + c].transpose(0, 1)  # (Hkv, C, D), strided
            v = sv[self.first : self.first + c].transpose(0, 1)
        else:  # scattered slots: keys through the value buffer, then the values
            k = v = self._gather(sk)
        rope_into(k, self.cos, self.sin, self._k)
        if self.first is None:
            self._gather(sv)
        return self._k, v

    def _gather(self, layer: Tensor) -> Tensor:
        """The context's rows of one store layer (S, Hkv, D), head-major, into the
        value buffer (Hkv, C, D): one row lookup per head, each head's range dense."""
        for h, out in enumerate(self._v_buf.unbind(0)):
            torch.index_select(layer[:, h], 0, self.slots, out=out)  # (C, D)
        return self._v_buf

    def free(self) -> None:
        """Give the scratch range back (idempotent); its last reader calls this."""
        if self.scratch is not None:
            self.scratch.release(self.scratch_base, self._c)
            self.scratch = None


def _ints(values: Sequence[int] | Tensor) -> list[int]:
    return values.tolist() if isinstance(values, Tensor) else list(values)
