"""Attention over a call's view: one small interface, one CPU reference backend.

A CUDA backend (FlexAttention over the store with a block mask, or a Triton
kernel) slots in by implementing `AttentionBackend`.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from corps.cache.view import CallView


class AttentionBackend(Protocol):
    def attend(self, layer: int, q: Tensor, view: CallView, scale: float) -> Tensor:
        """Attention of t new queries q (t, Hq, D) that were just appended to `view`.

        Query i sits at view index `view.length + i` and sees view[: view.length + i + 1]:
        the whole context (parents) and its own message's earlier tokens.
        Returns (t, Hq, D).
        """
        ...


class SdpaAttention:
    """Reference backend on torch ops.

    Grouped-query attention without copying K/V: the G query heads that share a
    KV head are stacked as G*t queries of that head, so each KV head is read once.
    """

    def attend(self, layer: int, q: Tensor, view: CallView, scale: float) -> Tensor:
        t, hq, d = q.shape
        n = view.length + t
        k = view.k_layers[layer][:, :n]  # (Hkv, n, D)
        v = view.v_layers[layer][:, :n]  # (Hkv, n, D)
        hkv = k.shape[0]
        g = hq // hkv
        if t == 1:  # decode: every key is visible, two small matmuls beat SDPA's overhead
            qg = q.view(hkv, g, d) * scale  # (Hkv, G, D)
            probs = torch.softmax(torch.bmm(qg, k.transpose(1, 2)), dim=-1)  # (Hkv, G, n)
            return torch.bmm(probs, v).view(1, hq, d)
        qg = q.view(t, hkv, g, d).permute(1, 2, 0, 3).reshape(hkv, g * t, d)  # (Hkv, G t, D)
        rows = torch.arange(t, device=q.device) + view.length  # (t,)
        mask = torch.arange(n, device=q.device)[None, :] <= rows[:, None]  # (t, n)
        out = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask.repeat(g, 1), scale=scale)
        return out.view(hkv, g, t, d).permute(2, 0, 1, 3).reshape(t, hq, d)
