"""`DecodePlan`: a batched step over calls whose views live in one arena."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
from torch import Tensor

from corps.cache.arena import ViewArena
from corps.cache.view import CallView

#: Calls reading one context in a decode step form a group when grouping saves
#: gathering at least this many keys ((readers - 1) x context). Below it, the few
#: extra ops per group cost more than the copy they save (measured on CPU: break-even
#: near 750 keys, e.g. 16 readers of 64 tokens or 2 of 1024; 16 x 4096 is 24x faster).
GROUP_MIN_SAVED = 768
#: What a decode plan costs of its own (its index tensors and a dozen ops a layer), in
#: padded keys of attention work; decodes are split into plans by length while that
#: saves more (`corps.engine.attention.routing.split_by_length`). Measured on the
#: default model (2-core Xeon, median of 4 alternated rounds): 16 decodes over views
#: spread from 0.25x to 1.75x of 800 words, 233 ms a step in one plan, 195 split at
#: 1024, 191 at 4096; 24 over 125-875 tokens, 189 / 201 at 256 (worse) / 181 at 4096;
#: equal views unchanged.
PLAN_KEYS = 4096


@dataclass(frozen=True)
class DecodePlan:
    """A batched step over B calls whose views all live in one arena (built once per step).

    Each call adds `t_b` rows: one for a decode, a few for a short prefill span (a
    role header, a short message). Rows are attended together, queries padded to
    the longest span (`t`), keys to the longest gathered part (`n`): one masked
    matmul per layer for every call instead of one attention per call.

    A view is a context (maybe shared) and an own part, each a range of the arena.
    Calls that share a context within this step form a group: its context is read
    once per step for all of them (`groups`), and only their own tokens are
    gathered; every other call's whole view is gathered, padded to N.
    """

    arena: ViewArena
    write: Tensor  # (T,) arena index of each new row, span after span
    gather: Tensor  # (B * N,) arena indices of each call's gathered keys, padded to N
    mask: Tensor  # (B, t, N) True where the row sees the gathered key
    n: int  # longest gathered part, new rows included
    ctx_base: Tensor  # (B,) arena index where each call's context starts
    ctx_len: Tensor  # (B,) tokens in each call's context
    own_base: Tensor  # (B,) arena index where each call's own tokens start
    lengths: Tensor  # (B,) each call's context + own tokens, new rows included
    longest: int  # max(lengths)
    groups: tuple[tuple[Any, Tensor], ...] = ()  # (SharedContext, (Bg,) call indices)
    t: int = 1  # rows of the longest span; 1 for a decode step
    padded: Tensor | None = None  # (T,) each row's index among the B x t padded rows
    # a static plan (`static`): splits per view of a decode kernel reading ragged
    # views, fixed so that its launch reads no length (None: sized from `longest`)
    splits: int | None = None

    @classmethod
    def of(
        cls,
        views: list[CallView],
        min_calls: int = 2,
        min_saved: int | None = GROUP_MIN_SAVED,
        rows: list[int] | None = None,
    ) -> DecodePlan | None:
        """The plan, or None when the step must take the per-call path. `rows` gives
        each call's new rows (default one each). Calls reading one context form a
        group (the torch backend reads it once) when that saves gathering `min_saved`
        keys or more; None never groups."""
        arena = views[0].batch_arena
        if len(views) < min_calls or arena is None:
            return None
        if any(v.batch_arena is not arena for v in views):
            return None
        in_store = [v.ctx is not None and v.ctx.in_store for v in views]
        if min_saved is None and any(in_store):  # such a context is only read as a group
            return None
        rows = rows or [1] * len(views)
        dev = arena.k.device  # index tensors live where the arena does
        grouped = shared_readers(views, min_saved)
        in_group = {i for ix in grouped for i in ix}
        cb = torch.tensor([v.ctx_base for v in views], device=dev)  # (B,)
        cl = torch.tensor([v.ctx_len for v in views], device=dev)  # (B,)
        ob = torch.tensor([v.own_base for v in views], device=dev)  # (B,)
        lengths = [v.length + r for v, r in zip(views, rows, strict=True)]  # with new rows
        n = torch.tensor(lengths, device=dev)  # (B,)
        # gathered part of each call: own tokens only in a group, else the whole view
        skips = [v.ctx_len if i in in_group else 0 for i, v in enumerate(views)]
        skip = torch.tensor(skips, device=dev)  # (B,)
        m = n - skip  # (B,) gathered keys
        width = max(a - b for a, b in zip(lengths, skips, strict=True))  # no device sync
        ar = torch.arange(width, device=dev)  # (N,)
        j = skip[:, None] + torch.minimum(ar[None, :], m[:, None] - 1)  # (B, N), pads repeat
        idx = arena_index(j, cb, cl, ob)  # (B, N)
        groups = tuple((views[ix[0]].ctx, torch.tensor(ix, device=dev)) for ix in grouped)
        # new rows go after each call's own tokens: own_base + own length + i
        first = [v.own_base + v.length - v.ctx_len for v in views]
        write = [f + i for f, r in zip(first, rows, strict=True) for i in range(r)]
        write = torch.tensor(write, device=dev)  # (T,)
        mask, padded = _row_masks(rows, m, width)
        return cls(arena, write, idx.flatten(), mask, width, cb, cl, ob, n,
                   max(lengths), groups, max(rows), padded)  # fmt: skip

    @classmethod
    def static(
        cls,
        arena: ViewArena,
        write: Tensor,
        ctx_base: Tensor,
        ctx_len: Tensor,
        own_base: Tensor,
        lengths: Tensor,
        width: int | None,
        splits: int | None = None,
    ) -> DecodePlan:
        """A one-row-per-call plan built from tensors alone (B,) each, no host value
        read from them: what a CUDA graph replays (`corps.engine.model.static_decode`).
        Every view is gathered whole, padded to `width` keys (>= the longest), and
        nothing is grouped; `longest` is `width`, an upper bound. With `width` None
        nothing is gathered: a decode kernel that reads ragged views takes each
        view's ranges itself, in `splits` splits."""
        if width is None:
            none = write.new_zeros(0)
            return cls(arena, write, none, none.bool(), 0, ctx_base, ctx_len, own_base,
                       lengths, 0, splits=splits)  # fmt: skip
        ar = torch.arange(width, device=write.device)  # (N,)
        j = torch.minimum(ar[None, :], lengths[:, None] - 1)  # (B, N), pads repeat the last
        idx = arena_index(j, ctx_base, ctx_len, own_base)  # (B, N)
        mask = (ar[None, :] < lengths[:, None])[:, None]  # (B, 1, N)
        return cls(arena, write, idx.flatten(), mask, width, ctx_base, ctx_len, own_base,
                   lengths, width, splits=splits)  # fmt: skip

    @cached_property
    def rows(self) -> Tensor:
        """(Hkv B N,) rows of a layer's arena seen as (Hkv A, D) that `gather` picks,
        for every KV head: a row lookup on dim 0 is 1.2-3.6x faster here than the
        same `index_select` on the arena's token dim (16 calls x 300 keys: 133 us
        against 165-479), twice per layer of every decode step."""
        heads, size = self.arena.k.shape[1:3]
        head = torch.arange(heads, device=self.gather.device) * size  # (Hkv,)
        return (head[:, None] + self.gather[None, :]).flatten()

    def gathered(self, arena_layer: Tensor) -> Tensor:
        """Each call's gathered keys (or values) of one layer: (Hkv, A, D) -> (Hkv, B, N, D)."""
        hkv, _, d = arena_layer.shape
        picked = arena_layer.view(-1, d).index_select(0, self.rows)  # (Hkv B N, D)
        return picked.view(hkv, self.ctx_len.shape[0], self.n, d)

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write the new rows' k, v (T, Hkv, D) into the arena; return the layer's
        arena keys and values (Hkv, A, D)."""
        ak, av = self.arena.k_layers[layer], self.arena.v_layers[layer]
        ak.index_copy_(1, self.write, k.transpose(0, 1))
        av.index_copy_(1, self.write, v.transpose(0, 1))
        return ak, av


def shared_readers(views: list[CallView], min_saved: int | None) -> list[list[int]]:
    """Indices of the calls reading one context that a plan over `views` groups (it
    reads their context once): those whose grouping saves gathering `min_saved` keys
    or more, or whose context is in the store; none when `min_saved` is None."""
    if min_saved is None:
        return []
    readers: dict[int, list[int]] = {}
    for i, v in enumerate(views):
        if v.ctx is not None:
            readers.setdefault(id(v.ctx), []).append(i)
    return [
        ix
        for ix in readers.values()
        if (len(ix) - 1) * views[ix[0]].ctx_len >= max(1, min_saved) or views[ix[0]].ctx.in_store
    ]


def gathered_lengths(views: list[CallView], min_saved: int | None) -> list[int]:
    """Keys a plan over `views` gathers for each call: its own tokens when it reads a
    grouped context (`shared_readers`), else its whole view."""
    grouped = {i for ix in shared_readers(views, min_saved) for i in ix}
    return [v.length - v.ctx_len if i in grouped else v.length for i, v in enumerate(views)]


def _row_masks(rows: list[int], m: Tensor, width: int) -> tuple[Tensor, Tensor | None]:
    """Which gathered keys each row sees, for calls adding `rows` (B,) rows over m (B,)
    gathered keys (new rows last), padded to `width`: (B, t, N), and each real row's
    index among the B x t padded rows (None when every call adds one row):
    row i of a t_b-row span sees the keys before m_b - (t_b - 1 - i); a padding row
    (i >= t_b) sees them all, so its softmax is defined (and dropped)."""
    dev = m.device
    ar = torch.arange(width, device=dev)  # (N,)
    t = max(rows)
    if t == 1:
        return (ar[None, :] < m[:, None])[:, None], None  # (B, 1, N)
    r = torch.tensor(rows, device=dev)  # (B,)
    ti = torch.arange(t, device=dev)  # (t,)
    seen = m[:, None] - (r[:, None] - 1 - ti[None, :]).clamp(min=0)  # (B, t)
    padded = [b * t + i for b, rb in enumerate(rows) for i in range(rb)]
    return ar[None, None, :] < seen[:, :, None], torch.tensor(padded, device=dev)  # (B, t, N)


def arena_index(j: Tensor, ctx_base: Tensor, ctx_len: Tensor, own_base: Tensor) -> Tensor:
    """The arena index (B, N) of key j (B, N) of each view: its context's first
    ctx_len keys from ctx_base, then its own tokens from own_base (each (B,))."""
    return torch.where(
        j < ctx_len[:, None], ctx_base[:, None] + j, own_base[:, None] + j - ctx_len[:, None]
    )
