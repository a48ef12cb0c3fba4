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

A key's tag keeps apart contexts over the same slots and positions whose
contents differ: a repaired context (`corps.engine.exec.repairs`) is shared
by the calls repairing it alike, never by calls reading the stored encodings.
While its builder still writes into it (`writer`), no other call joins it.

A context comes in one of two kinds, chosen per engine (`contexts=`):

- `SharedContext` ("copy", the default): the rotated K and V held in the view
  arena. Attention reads them in place; the store and the copy make ~2x the
  context's KV memory.
- `StoreContext` ("store", in `corps.engine.attention.views`): nothing is copied.
  When a step reaches layer l, the
  context's keys of that layer are read from the store and rotated to their
  positions into a one-layer scratch range (1/L of a copy), and its values are
  read from the store in place (gathered into the scratch when its slots are
  not one run). KV memory is the store's plus the calls' own tokens; the price
  is that rotation, paid at every step and layer (`corps bench memory` measures
  both kinds side by side).

Both answer `layer(l) -> (k, v)`, each (Hkv, C, D), which is all attention reads.
"""

from __future__ import annotations

from typing import Protocol

from torch import Tensor

from corps.cache.arena import ViewArena

#: (store slots, positions, tag): the tag tells apart contexts over the same slots at
#: the same positions whose contents differ, e.g. one a repair rewrote (`()`: as stored)
ContextKey = tuple[tuple[int, ...], tuple[int, ...], tuple]


class Context(Protocol):
    """What a view and attention read of a placed context, whatever its kind."""

    key: ContextKey | None  # None: not shareable (built without a pool)
    in_store: bool  # read from the store (keys rotated per step), not the arena
    arena: ViewArena | None  # the arena holding it, if any
    base: int  # its first arena index
    refs: int  # live views reading it
    writer: object | None  # a reader still writing into it (a repair), else None

    @property
    def length(self) -> int: ...

    def layer(self, layer: int) -> tuple[Tensor, Tensor]:
        """Rotated keys and values of one layer, (Hkv, C, D) each."""

    def free(self) -> None:
        """Give its memory back (its last reader calls this)."""


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
        self.writer: object | None = None  # its builder while a repair rewrites it
        self.awaited = False  # calls wait to read it once its writer's rows have run

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


class ContextPool:
    """The live shared contexts of one engine, by (slots, positions)."""

    def __init__(self) -> None:
        self._live: dict[ContextKey, SharedContext] = {}
        self.tokens = 0  # tokens live contexts hold in the view arena

    def __len__(self) -> int:
        return len(self._live)

    def peek(self, key: ContextKey) -> SharedContext | None:
        """The live context for key, if any, without reading it."""
        return self._live.get(key)

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
