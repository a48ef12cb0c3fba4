"""Shared contexts: one rotated copy of a placed context for every call that reads it.

Choreographed workflows are many calls reading one context: sixteen voters over
the same sixteen branches at the same offsets, three debaters over one history.
A call's context is fully named by its store slots and the positions it gives
them, and those slots cannot change while any reader runs (parents are pinned,
radix prefixes locked). So the rotated K/V of a context is built once, by the
first call that needs it, and every concurrent call with the same (slots,
positions) reads that copy. It is dropped when its last reader is done, so a
context never outlives the pins that keep its slots valid.

Memory for B calls sharing a C-token context: C + B x (their own tokens),
instead of B x (C + own).

A context comes in one of two kinds, chosen per engine (`contexts=`):

- `SharedContext` ("copy", the default): the rotated K and V held in the view
  arena. Attention reads them in place; the store and the copy make ~2x the
  context's KV memory.
- `StoreContext` ("store"): nothing is copied. When a step reaches layer l, the
  context's keys of that layer are read from the store and rotated to their
  positions into a one-layer scratch range (1/L of a copy), and its values are
  read from the store in place (gathered into the scratch when its slots are
  not one run). KV memory is the store's plus the calls' own tokens; the price
  is that rotation, paid at every step and layer (`corps bench memory` measures
  both kinds side by side).

Both answer `layer(l) -> (k, v)`, each (Hkv, C, D), which is all attention reads.
"""

from __future__ import annotations

import torch
from torch import Tensor

from corps.cache.arena import ViewArena
from corps.cache.errors import ViewsFull
from corps.cache.rope import RopeTables, rope_into

ContextKey = tuple[tuple[int, ...], tuple[int, ...]]  # (store slots, positions)


class SharedContext:
    """Rotated K and V of one context (L, Hkv, C, D), read by `refs` live views."""

    in_store = False  # read from the view arena (a StoreContext is read from the store)

    def __init__(
        self, key: ContextKey | None, k: Tensor, v: Tensor, arena: ViewArena | None, base: int
    ) -> None:
        self.key = key  # None: not shareable (built without a pool)
        self.k = k  # (L, Hkv, C, D), rotated to the key's positions
        self.v = v  # (L, Hkv, C, D)
        self.k_layers = k.unbind(0)  # per layer (Hkv, C, D)
        self.v_layers = v.unbind(0)
        self.arena = arena  # k, v are arena.k/v[:, :, base : base + C] when set
        self.base = base
        self.refs = 0

    @property
    def length(self) -> int:
        return self.k.shape[2]

    @property
    def view_tokens(self) -> int:
        """Tokens it holds in the view arena."""
        return self.length

    def layer(self, layer: int) -> tuple[Tensor, Tensor]:
        """Rotated keys and values of one layer, (Hkv, C, D) each."""
        return self.k_layers[layer], self.v_layers[layer]

    def free(self) -> None:
        """Give the arena range back (idempotent); its last reader calls this."""
        if self.arena is not None:
            self.arena.release(self.base, self.length)
            self.arena = None


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


class ContextPool:
    """The live shared contexts of one engine, by (slots, positions)."""

    def __init__(self) -> None:
        self._live: dict[ContextKey, SharedContext] = {}
        self.tokens = 0  # tokens live contexts hold in the view arena

    def __len__(self) -> int:
        return len(self._live)

    def get(self, key: ContextKey) -> SharedContext | None:
        """The live context for key, with one more reader; None if there is none."""
        ctx = self._live.get(key)
        if ctx is not None:
            ctx.refs += 1
        return ctx

    def add(self, ctx: SharedContext) -> None:
        """Register a freshly built context, held by its first reader."""
        assert ctx.key not in self._live, "a context is built once per key"
        ctx.refs = 1
        self._live[ctx.key] = ctx
        self.tokens += ctx.view_tokens

    def release(self, ctx: SharedContext) -> None:
        """One reader is done; the last one gives the context's memory back."""
        ctx.refs -= 1
        if ctx.refs > 0:
            return
        if self._live.get(ctx.key) is ctx:
            del self._live[ctx.key]
            self.tokens -= ctx.view_tokens
        ctx.free()
