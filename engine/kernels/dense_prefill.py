"""dense_prefill: prefill attention of one span whose keys are one contiguous run of the
view arena, through SDPA (flash attention on a GPU) rather than a block mask.

Contract: the span's T rows are the last T of its W keys, arena positions
[start, start + W) of one layer (its context, if any, then its own tokens, back to
back), and row i sees keys [0, W - T + i] (causal, aligned to the lower right: every
row sees the whole prefix before the span). Shapes: q (T, Hq, D); k, v (Hkv, W, D);
out (T, Hq, D). The same numbers as `flex_prefill` over the same window (the
exactness tests compare them), without the block mask, its build or its compile.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.bias import causal_lower_right


def lower_right_mask(t: int, w: int, device: torch.device) -> object | None:
    """The mask of T rows over W keys, built once per step: None when W == T (plain
    causal); on CUDA torch's lower-right causal bias, which flash attention takes as
    its own causal mask; elsewhere the (T, W) boolean mask."""
    if w == t:
        return None
    if device.type == "cuda":
        return causal_lower_right(t, w)
    return torch.arange(w, device=device)[None] <= torch.arange(w - t, w, device=device)[:, None]


def dense_prefill(q: Tensor, k: Tensor, v: Tensor, scale: float, mask: object | None) -> Tensor:
    """`mask` is `lower_right_mask(T, W, device)`."""
    g = q.shape[1] // k.shape[0]
    if g > 1:  # grouped-query heads, spelled out: the lower-right causal kernels want Hq
        k, v = k.repeat_interleave(g, dim=0), v.repeat_interleave(g, dim=0)  # (Hq, W, D)
    qh = q.transpose(0, 1)[None]  # (1, Hq, T, D)
    out = F.scaled_dot_product_attention(
        qh, k[None], v[None], attn_mask=mask, is_causal=mask is None, scale=scale
    )  # (1, Hq, T, D)
    return out[0].transpose(0, 1)  # (T, Hq, D)
