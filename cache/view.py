"""A call's rotated view of the store: the context one in-flight call attends to.

Design (repositioning and concurrency): the global store keeps keys unrotated.
When a call starts, the keys of its context are gathered and rotated to the
logical positions *this call* gives them; the call's own new tokens are
appended after them as they are encoded. So:

- two concurrent calls placing the same parent at different offsets each see
  correctly rotated keys, and neither mutates what the other reads;
- the per-step attention cost follows the call's own context, never the size
  of the store (the gather is done once per context, not per step);
- the store holds exactly one canonical copy per token.

A view has two parts. The context (`SharedContext`) is shared by every
concurrent call that places the same slots at the same positions (see
`corps.cache.context`), so B calls over one C-token context hold C + B x own
tokens, not B x C. The own part holds this call's new tokens. The first call
to build a context gets both parts as one range (`contiguous`), so a lone call
reads its whole view as one slice, exactly as before sharing existed; a call
joining a live context reads the two parts side by side. With an engine's
contexts="store", the context is a `StoreContext` read from the store itself
(nothing copied; `corps.engine.attention.views`), and only the own part is in
the arena. Views are built by `corps.engine.attention.views.open_view`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from corps.cache.arena import ViewArena
from corps.cache.context import Context, ContextPool
from corps.cache.errors import ViewsFull
from corps.cache.kv import KVStore


class CallView:
    """Rotated K and V of one call's context (shared) plus its own tokens so far."""

    def __init__(
        self,
        ctx: Context | None,
        own_k: Tensor,
        own_v: Tensor,
        arena: ViewArena | None,
        own_base: int,
        whole: tuple[Tensor, Tensor] | None = None,
        pool: ContextPool | None = None,
        built: bool = False,
    ) -> None:
        self.ctx = ctx
        self.ctx_len = ctx.length if ctx is not None else 0
        self.own_k = own_k  # (L, Hkv, E, D) rotated; head-major, each head's keys contiguous
        self.own_v = own_v  # (L, Hkv, E, D)
        self.own_k_layers = own_k.unbind(0)  # per layer (Hkv, E, D): decode steps are hot
        self.own_v_layers = own_v.unbind(0)
        self.length = self.ctx_len  # context + own tokens filled so far
        # context and own part as one (L, Hkv, C + E, D) tensor, when they are adjacent
        self.k = whole[0] if whole is not None else None
        self.v = whole[1] if whole is not None else None
        self.k_layers = self.k.unbind(0) if self.k is not None else None
        self.v_layers = self.v.unbind(0) if self.v is not None else None
        self.own_arena = arena  # own_k/v are arena.k/v[:, :, own_base : own_base + E] when set
        self.own_base = own_base
        self.pool = pool
        self.built = built  # it made its context (its first reader), not joined a live one

    @property
    def contiguous(self) -> bool:
        """Context and own tokens are one slice (`k_layers`, `v_layers`)."""
        return self.k is not None

    @property
    def capacity(self) -> int:
        """Tokens of this call's own part (the context is counted by its pool)."""
        return self.own_k.shape[2]

    @property
    def arena(self) -> ViewArena | None:
        """The arena holding both parts of this view, or None if either is standalone
        or the context is read from the store."""
        ctx = self.ctx
        if ctx is not None and ctx.arena is not self.own_arena:
            return None
        return self.own_arena

    @property
    def batch_arena(self) -> ViewArena | None:
        """The arena a batched step (`DecodePlan`) reads this view from: as `arena`,
        except that a context read from the store does not stand in the way (such a
        context is always read through its own `layer`)."""
        if self.ctx is not None and self.ctx.in_store:
            return self.own_arena
        return self.arena

    @property
    def ctx_base(self) -> int:
        """Arena index of the context's first token (own_base when there is none)."""
        return self.ctx.base if self.ctx is not None else self.own_base

    @property
    def own_length(self) -> int:
        return self.length - self.ctx_len

    def release(self) -> None:
        """Give the own range back and let go of the context (idempotent)."""
        if self.own_arena is not None:
            self.own_arena.release(self.own_base, self.capacity)
            self.own_arena = None
        ctx, self.ctx = self.ctx, None
        if ctx is not None:
            let_go(ctx, self.pool)

    def append(self, layer: int, k_rot: Tensor, v: Tensor) -> None:
        """Write t new rotated keys and values (t, Hkv, D) after the current length.

        The length itself advances once per forward step, in `advance`.
        """
        t, n = k_rot.shape[0], self.length - self.ctx_len
        if t == 1:
            self.own_k_layers[layer][:, n].copy_(k_rot[0])
            self.own_v_layers[layer][:, n].copy_(v[0])
        else:
            self.own_k_layers[layer][:, n : n + t] = k_rot.transpose(0, 1)
            self.own_v_layers[layer][:, n : n + t] = v.transpose(0, 1)

    def advance(self, t: int) -> None:
        self.length += t

    def copy_own(self, other: CallView, t: int) -> None:
        """Take `other`'s first t own tokens as this view's (every layer) and advance:
        for a twin call whose own tokens would be the same (`corps.engine.exec.batch`)."""
        n = self.own_length
        self.own_k[:, :, n : n + t] = other.own_k[:, :, :t]
        self.own_v[:, :, n : n + t] = other.own_v[:, :, :t]
        self.advance(t)


def let_go(ctx: Context, pool: ContextPool | None) -> None:
    """One reader is done with ctx: the pool's last reader frees it; a context built
    without a pool has that one reader."""
    if ctx.key is not None:
        pool.release(ctx)
    else:
        ctx.free()


def carve(store: KVStore, arena: ViewArena | None, n: int) -> tuple[Tensor, Tensor, int | None]:
    """(L, Hkv, n, D) K and V: an arena range and its start, or ViewsFull; new tensors
    when there is no arena."""
    if arena is not None:
        base = arena.alloc(n)
        if base is None:
            raise ViewsFull(
                f"the view arena has no free range of {n} tokens ({arena.free_tokens} free of "
                f"{arena.capacity}); the call waits for running calls to finish, or open the "
                f"engine with a larger memory_budget"
            )
        return arena.k[:, :, base : base + n], arena.v[:, :, base : base + n], base
    layers, _, heads, dim = store.k.shape
    shape = (layers, heads, n, dim)
    k = torch.empty(shape, dtype=store.k.dtype, device=store.k.device)
    v = torch.empty(shape, dtype=store.v.dtype, device=store.v.device)
    return k, v, None
