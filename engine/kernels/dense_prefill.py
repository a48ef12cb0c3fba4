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

import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.bias import causal_lower_right


def dense_prefill(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    t, hq, _ = q.shape
    w, g = k.shape[1], hq // k.shape[0]
    if g > 1:  # grouped-query heads, spelled out: the lower-right causal kernels want Hq
        k, v = k.repeat_interleave(g, dim=0), v.repeat_interleave(g, dim=0)  # (Hq, W, D)
    qh = q.transpose(0, 1)[None]  # (1, Hq, T, D)
    mask = None if w == t else causal_lower_right(t, w)
    out = F.scaled_dot_product_attention(
        qh, k[None], v[None], attn_mask=mask, is_causal=w == t, scale=scale
    )  # (1, Hq, T, D)
    return out[0].transpose(0, 1)  # (T, Hq, D)
