"""Attention over a call's view: one small interface, one CPU reference backend.

A CUDA backend (FlexAttention over the store with a block mask, or a Triton
kernel) slots in by implementing `AttentionBackend`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from corps.cache.arena import ViewArena
from corps.cache.view import CallView


@dataclass(frozen=True)
class DecodePlan:
    """A decode step over B calls whose views all live in one arena (built once per step)."""

    arena: ViewArena
    write: Tensor  # (B,) arena index of each call's new token
    gather: Tensor  # (B * N,) arena indices of each call's context, padded to N
    mask: Tensor  # (B, N) True where the padded position is real
    n: int  # longest context, new token included

    @classmethod
    def of(cls, views: list[CallView]) -> DecodePlan | None:
        arena = views[0].arena
        if len(views) < 2 or arena is None or any(v.arena is not arena for v in views):
            return None
        dev = arena.k.device  # index tensors live where the arena does
        base = torch.tensor([v.base for v in views], device=dev)  # (B,)
        n = torch.tensor([v.length + 1 for v in views], device=dev)  # (B,)
        width = int(n.max())
        ar = torch.arange(width, device=dev)  # (N,)
        idx = base[:, None] + torch.minimum(ar[None, :], n[:, None] - 1)  # (B, N), pads repeat
        return cls(arena, base + n - 1, idx.flatten(), ar[None, :] < n[:, None], width)


class AttentionBackend(Protocol):
    def attend(self, layer: int, q: Tensor, view: CallView, scale: float) -> Tensor:
        """Attention of t new queries q (t, Hq, D) that were just appended to `view`.

        Query i sits at view index `view.length + i` and sees view[: view.length + i + 1]:
        the whole context (parents) and its own message's earlier tokens.
        Returns (t, Hq, D).
        """
        ...

    def attend_decode(
        self, layer: int, q: Tensor, k: Tensor, v: Tensor, plan: DecodePlan, scale: float
    ) -> Tensor:
        """A decode step of B calls whose views share an arena: append k, v (B, Hkv, D)
        and attend q (B, Hq, D) over each call's context. Returns (B, Hq, D)."""
        ...


class SdpaAttention:
    """Reference backend on torch ops (see `attend` and `attend_decode`)."""

    def attend_decode(
        self, layer: int, q: Tensor, k: Tensor, v: Tensor, plan: DecodePlan, scale: float
    ) -> Tensor:
        """One decode token for each of B calls: q (B, Hq, D), new k, v (B, Hkv, D).

        Appends every call's new key/value with one index_copy_ and attends over
        all contexts at once, padded to the longest and masked. Returns (B, Hq, D).
        """
        ak, av = plan.arena.k_layers[layer], plan.arena.v_layers[layer]  # (Hkv, A, D)
        ak.index_copy_(1, plan.write, k.transpose(0, 1))
        av.index_copy_(1, plan.write, v.transpose(0, 1))
        b, hq, d = q.shape
        hkv = ak.shape[0]
        keys = ak.index_select(1, plan.gather).view(hkv, b, plan.n, d)  # (Hkv, B, N, D)
        values = av.index_select(1, plan.gather).view(hkv, b, plan.n, d)  # (Hkv, B, N, D)
        qg = (q * scale).view(b, hkv, hq // hkv, d).transpose(0, 1)  # (Hkv, B, G, D)
        scores = qg @ keys.transpose(-1, -2)  # (Hkv, B, G, N)
        scores = scores.masked_fill(~plan.mask[None, :, None, :], float("-inf"))
        out = torch.softmax(scores, dim=-1) @ values  # (Hkv, B, G, D)
        return out.transpose(0, 1).reshape(b, hq, d)

    def attend(self, layer: int, q: Tensor, view: CallView, scale: float) -> Tensor:
        """Per call. Grouped-query attention without copying K/V: the G query heads
        that share a KV head are stacked as G*t queries of that head."""
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
