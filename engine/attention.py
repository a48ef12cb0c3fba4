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
    """Reference backend: torch's scaled_dot_product_attention over the view."""

    def attend(self, layer: int, q: Tensor, view: CallView, scale: float) -> Tensor:
        t = q.shape[0]
        n = view.length + t
        k = view.k[layer, :n].transpose(0, 1)  # (Hkv, n, D)
        v = view.v[layer, :n].transpose(0, 1)  # (Hkv, n, D)
        qh = q.transpose(0, 1)  # (Hq, t, D)
        mask = None
        if t > 1:
            rows = torch.arange(t, device=q.device)[:, None] + view.length  # (t, 1)
            mask = torch.arange(n, device=q.device)[None, :] <= rows  # (t, n)
        out = F.scaled_dot_product_attention(
            qh, k, v, attn_mask=mask, scale=scale, enable_gqa=k.shape[0] != qh.shape[0]
        )  # (Hq, t, D)
        return out.transpose(0, 1)
