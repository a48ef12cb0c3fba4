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
"""

from __future__ import annotations

from torch import Tensor

from corps.cache.arena import ViewArena

ContextKey = tuple[tuple[int, ...], tuple[int, ...]]  # (store slots, positions)


class SharedContext:
    """Rotated K and V of one context (L, Hkv, C, D), read by `refs` live views."""

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

    def free(self) -> None:
        """Give the arena range back (idempotent); its last reader calls this."""
        if self.arena is not None:
            self.arena.release(self.base, self.length)
            self.arena = None


class ContextPool:
    """The live shared contexts of one engine, by (slots, positions)."""

    def __init__(self) -> None:
        self._live: dict[ContextKey, SharedContext] = {}
        self.tokens = 0  # tokens held by live contexts

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
        self.tokens += ctx.length

    def release(self, ctx: SharedContext) -> None:
        """One reader is done; the last one gives the context's memory back."""
        ctx.refs -= 1
        if ctx.refs > 0:
            return
        if self._live.get(ctx.key) is ctx:
            del self._live[ctx.key]
            self.tokens -= ctx.length
        ctx.free()
