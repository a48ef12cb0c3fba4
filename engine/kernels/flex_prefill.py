"""flex_prefill: prefill attention of one step's rows, from any number of calls, in one
FlexAttention launch over the view arena.

Contract: row r (a new token of some call) attends to the arena positions
[lo[r], hi[r]) (its call's context, maybe shared with other calls) and
[own_lo[r], own_hi[r]) (its own message's earlier tokens and itself), all
already written to the arena (rotated keys). Shapes: q (T, Hq, D); arena_k,
arena_v (Hkv, A, D) for one layer; lo <= hi, own_lo < own_hi (T,) long (without
own bounds, [lo, hi) is the whole view, lo < hi); out (T, Hq, D).
Grouped-query attention is native (enable_gqa). The block mask is built once per
step (`PrefillMask.build`) and shared by every layer: only the key window the
step touches, [min lo, max hi), is handed to FlexAttention.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import cache

import torch
from torch import Tensor

from corps.engine.kernels.op_count import count_kernel


def prefill_attention_ref(
    q: Tensor, arena_k: Tensor, arena_v: Tensor, lo: Tensor, hi: Tensor, scale: float,
    own_lo: Tensor | None = None, own_hi: Tensor | None = None,
) -> Tensor:  # fmt: skip
    """Brute force, row by row, in float32. Returns (T, Hq, D) in q's dtype."""
    g = q.shape[1] // arena_k.shape[0]
    out = torch.empty_like(q)
    if own_lo is None:
        own_lo = own_hi = hi
    for r in range(q.shape[0]):
        a, b, c, e = int(lo[r]), int(hi[r]), int(own_lo[r]), int(own_hi[r])
        k = torch.cat([arena_k[:, a:b], arena_k[:, c:e]], 1).float()  # (Hkv, n, D)
        v = torch.cat([arena_v[:, a:b], arena_v[:, c:e]], 1).float()
        k = k.repeat_interleave(g, dim=0)  # (Hq, n, D)
        v = v.repeat_interleave(g, dim=0)  # (Hq, n, D)
        scores = torch.einsum("hd,hnd->hn", q[r].float() * scale, k)  # (Hq, n)
        out[r] = torch.einsum("hn,hnd->hd", torch.softmax(scores, dim=-1), v).to(q.dtype)
    return out


#: FlexAttention's block size: the compiled kernel's shapes are padded in these
BLOCK = 128


@dataclass(frozen=True)
class PrefillMask:
    """The block mask of one step, over the key window [start, end) of the arena, and
    over `q_len` query rows (the step's own, or more when padded: `padded_rows`)."""

    block_mask: object  # torch.nn.attention.flex_attention.BlockMask
    start: int
    end: int
    q_len: int

    @classmethod
    def build(
        cls,
        lo: Tensor,
        hi: Tensor,
        own_lo: Tensor | None = None,
        own_hi: Tensor | None = None,
        arena_size: int | None = None,
    ) -> PrefillMask:
        """With `arena_size`, shapes padded for the compiled kernel (`padded`)."""
        from torch.nn.attention.flex_attention import create_block_mask

        if own_lo is None:
            own_lo = own_hi = hi
        start = int(torch.minimum(lo, own_lo).min())
        end = int(torch.maximum(hi, own_hi).max())
        if arena_size is not None:
            lo, hi, own_lo, own_hi = (padded_rows(x) for x in (lo, hi, own_lo, own_hi))
            start, end = padded_window(start, end, arena_size)
        lo_w, hi_w = lo - start, hi - start  # (T,) bounds inside the window
        olo_w, ohi_w = own_lo - start, own_hi - start

        def visible(b, h, q_idx, kv_idx):
            ctx = (kv_idx >= lo_w[q_idx]) & (kv_idx < hi_w[q_idx])
            return ctx | ((kv_idx >= olo_w[q_idx]) & (kv_idx < ohi_w[q_idx]))

        mask = create_block_mask(
            visible, B=None, H=None, Q_LEN=lo.numel(), KV_LEN=end - start, device=lo.device
        )
        return cls(mask, start, end, lo.numel())


# Compiled FlexAttention specialises on a few shapes: fewer than 128 query rows or
# not, one key block or more, a key window at the arena's start or not (dynamo's 0/1
# specialisation); each variant is a compile of 5-12 s on an H200. Padded, every
# step but those whose window starts at 0 is one variant.


def padded_rows(x: Tensor) -> Tensor:
    """Per-row bounds (T,) padded to a multiple of BLOCK rows (at least one block);
    padded rows copy row 0's bounds (their outputs are dropped)."""
    t = x.numel()
    want = max(BLOCK, -(-t // BLOCK) * BLOCK)
    return torch.cat([x, x[:1].expand(want - t)]) if want > t else x


def padded_window(start: int, end: int, arena_size: int) -> tuple[int, int]:
    """The key window [start, end) widened to at least two blocks inside the arena."""
    end = min(arena_size, max(end, start + 2 * BLOCK))
    return max(0, min(start, end - 2 * BLOCK)), end


@cache
def _flex(compiled: bool):
    from torch.nn.attention.flex_attention import flex_attention

    if compiled:
        return torch.compile(flex_attention, dynamic=True)
    # Eager is what we ask for off CUDA (dense, exact, no compile): not worth a warning.
    warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    return flex_attention


def kernel_options(compiled: bool) -> dict | None:
    """Compiled, every step takes FlexAttention's main kernel. Below 128 query rows
    inductor would pick its decoding template instead, which cannot lower a grouped-
    query step whose block mask is shared by all heads (Hq=32, Hkv=8 on an H100,
    torch 2.11: `NoValidChoicesError ... target: flex_attention`): most choreographed
    prefills are one short message, and Llama-3, Qwen2.5 and Mistral group 4+ heads."""
    return {"FORCE_USE_FLEX_ATTENTION": True} if compiled else None


def flex_prefill(
    q: Tensor,
    arena_k: Tensor,
    arena_v: Tensor,
    mask: PrefillMask,
    scale: float,
    compiled: bool | None = None,
) -> Tensor:
    """FlexAttention (same contract as `prefill_attention_ref`, bounds from `mask`).

    `compiled` defaults to True on CUDA (the fast path) and False elsewhere (eager
    FlexAttention, which computes the same thing densely)."""
    if compiled is None:
        compiled = q.is_cuda
    count_kernel("flex_attention")  # one launch, compiled; invisible to OpCounts eager
    k = arena_k[None, :, mask.start : mask.end]  # (1, Hkv, W, D)
    v = arena_v[None, :, mask.start : mask.end]  # (1, Hkv, W, D)
    rows = q.shape[0]
    pad = mask.q_len - rows  # padded rows (`PrefillMask.build`'s arena_size)
    if pad > 0:
        q = torch.cat([q, q.new_zeros(pad, *q.shape[1:])])  # (T', Hq, D)
    # q is often a view of the fused QKV projection, and how far apart its rows are
    # differs between steps (and models): contiguous, the compiled kernel's stride
    # guards hold for every step rather than recompiling until dynamo gives up (at its
    # recompile limit, 8, it fell back to eager FlexAttention, which materialises every
    # score: prefill at 12-26% of transformers' on an H200)
    out = _flex(compiled)(
        q.contiguous().transpose(0, 1)[None],  # (1, Hq, T', D)
        k,
        v,
        block_mask=mask.block_mask,
        scale=scale,
        enable_gqa=q.shape[1] != arena_k.shape[0],
        kernel_options=kernel_options(compiled),
    )  # (1, Hq, T', D)
    return out[0, :, :rows].transpose(0, 1)  # (T, Hq, D)
