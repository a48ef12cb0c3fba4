"""Attention over calls' views: one small interface, a torch reference backend, and the
CUDA path (Triton kernels for gathers and decode, FlexAttention for prefill).

`select_backend(device)` picks by device (`cuda`: Triton + Flex; `cpu`: torch) and
obeys `CORPS_ATTENTION=torch|triton|flex|triton+flex`. Every backend computes the
same thing; the kernels and their torch references live in `corps.engine.kernels`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.bias import causal_lower_right

from corps.cache.arena import ViewArena
from corps.cache.errors import InvalidRequest
from corps.cache.view import CallView
from corps.engine.kernels import interpreting, triton_available
from corps.engine.kernels.gather_rotate import gather_rotate_ref

BACKENDS = ("torch", "triton", "flex", "triton+flex")


@dataclass(frozen=True)
class DecodePlan:
    """A decode step over B calls whose views all live in one arena (built once per step)."""

    arena: ViewArena
    write: Tensor  # (B,) arena index of each call's new token
    gather: Tensor  # (B * N,) arena indices of each call's context, padded to N
    mask: Tensor  # (B, N) True where the padded position is real
    n: int  # longest context, new token included
    base: Tensor  # (B,) arena index where each call's view starts
    lengths: Tensor  # (B,) each call's context, new token included

    @classmethod
    def of(cls, views: list[CallView], min_calls: int = 2) -> DecodePlan | None:
        arena = views[0].arena
        if len(views) < min_calls or arena is None or any(v.arena is not arena for v in views):
            return None
        dev = arena.k.device  # index tensors live where the arena does
        base = torch.tensor([v.base for v in views], device=dev)  # (B,)
        n = torch.tensor([v.length + 1 for v in views], device=dev)  # (B,)
        width = int(n.max())
        ar = torch.arange(width, device=dev)  # (N,)
        idx = base[:, None] + torch.minimum(ar[None, :], n[:, None] - 1)  # (B, N), pads repeat
        mask = ar[None, :] < n[:, None]
        return cls(arena, base + n - 1, idx.flatten(), mask, width, base, n)

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write each call's new k, v (B, Hkv, D) into the arena; return the layer's
        arena keys and values (Hkv, A, D)."""
        ak, av = self.arena.k_layers[layer], self.arena.v_layers[layer]
        ak.index_copy_(1, self.write, k.transpose(0, 1))
        av.index_copy_(1, self.write, v.transpose(0, 1))
        return ak, av


class AttentionBackend(Protocol):
    name: str
    decode_min_calls: int  # decode steps of at least this many calls use attend_decode

    def gather(
        self,
        store_k: Tensor,
        store_v: Tensor,
        slots: Tensor,
        positions: Tensor,
        cos: Tensor,
        sin: Tensor,
        out_k: Tensor,
        out_v: Tensor,
    ) -> None:
        """Build a view: `corps.engine.kernels.gather_rotate` states the contract."""
        ...

    def plan_prefill(self, spans: tuple[Any, ...]) -> Any:
        """Per-step state shared by every layer's `attend_spans` (None if unused)."""
        ...

    def attend_spans(
        self, layer: int, q: Tensor, k: Tensor, v: Tensor, spans, plan: Any, scale: float
    ) -> Tensor:
        """Rows of a flat batch, grouped in spans (runner.SeqSpan), one span per call:
        append each span's rotated k, v (t, Hkv, D) to its view, then attend its
        queries q (t, Hq, D). Query i of a span sits at view index `view.length + i`
        and sees view[: view.length + i + 1]: its context and its own earlier tokens.
        Returns (T, Hq, D) in row order.
        """
        ...

    def attend_decode(
        self, layer: int, q: Tensor, k: Tensor, v: Tensor, plan: DecodePlan, scale: float
    ) -> Tensor:
        """A decode step of B calls whose views share an arena: append k, v (B, Hkv, D)
        and attend q (B, Hq, D) over each call's context. Returns (B, Hq, D)."""
        ...


class SdpaAttention:
    """Reference backend on torch ops (SDPA for prefill, two matmuls for decode)."""

    name = "torch"
    decode_min_calls = 2

    def gather(self, store_k, store_v, slots, positions, cos, sin, out_k, out_v) -> None:
        gather_rotate_ref(store_k, store_v, slots, positions, cos, sin, out_k, out_v)

    def plan_prefill(self, spans) -> Any:
        return None

    def attend_spans(self, layer, q, k, v, spans, plan, scale) -> Tensor:
        """Each span appends to and attends through its own view, one at a time."""
        outs = []
        for sp in spans:
            sp.view.append(layer, k[sp.start : sp.end], v[sp.start : sp.end])
            outs.append(self.attend(layer, q[sp.start : sp.end], sp.view, scale))
        return outs[0] if len(outs) == 1 else torch.cat(outs)  # (T, Hq, D)

    def attend_decode(
        self, layer: int, q: Tensor, k: Tensor, v: Tensor, plan: DecodePlan, scale: float
    ) -> Tensor:
        """One decode token for each of B calls: q (B, Hq, D), new k, v (B, Hkv, D).

        Appends every call's new key/value with one index_copy_ and attends over
        all contexts at once, padded to the longest and masked. Returns (B, Hq, D).
        """
        ak, av = plan.append(layer, k, v)  # (Hkv, A, D)
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
        """Per call, grouped-query attention without copying K/V."""
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
        # Query i sees keys [0, view.length + i]: causal, aligned to the bottom right.
        # As a causal bias (not a boolean mask) SDPA takes its fused flash kernel on
        # CPU too: 5x faster than the masked math path on a 512-token prompt.
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None],  # (1, Hq, t, D)
            k[None],  # (1, Hkv, n, D)
            v[None],
            attn_mask=causal_lower_right(t, n),
            scale=scale,
            enable_gqa=g > 1,
        )  # (1, Hq, t, D)
        return out[0].transpose(0, 1)  # (t, Hq, D)


class TritonAttention(SdpaAttention):
    """Gathers with `gather_rotate` and decodes with `decode_attention` (Triton); prefill
    stays on the torch reference."""

    name = "triton"
    decode_min_calls = 1

    def gather(self, store_k, store_v, slots, positions, cos, sin, out_k, out_v) -> None:
        from corps.engine.kernels.gather_rotate import gather_rotate

        gather_rotate(store_k, store_v, slots, positions, cos, sin, out_k, out_v)

    def attend_decode(self, layer, q, k, v, plan: DecodePlan, scale: float) -> Tensor:
        from corps.engine.kernels.decode_attention import decode_attention

        ak, av = plan.append(layer, k, v)  # (Hkv, A, D)
        return decode_attention(q, ak, av, plan.base, plan.lengths, scale, max_n=plan.n)


class FlexAttention(SdpaAttention):
    """Prefill with FlexAttention: all of a step's rows in one launch over the view
    arena, under a block mask built once per step. Steps whose views are not all in
    the arena (a view that did not fit is standalone) use the torch reference."""

    name = "flex"

    def plan_prefill(self, spans) -> Any:
        from corps.engine.kernels.flex_prefill import PrefillMask

        arena = spans[0].view.arena
        if arena is None or any(sp.view.arena is not arena for sp in spans):
            return None
        dev = arena.k.device
        t = torch.tensor([sp.end - sp.start for sp in spans], device=dev)  # (S,) rows
        base = torch.tensor([sp.view.base for sp in spans], device=dev)  # (S,)
        first = torch.tensor([sp.view.length + 1 for sp in spans], device=dev)  # (S,)
        lo = base.repeat_interleave(t)  # (T,) each row's view start
        row = torch.arange(int(t.sum()), device=dev) - (torch.cumsum(t, 0) - t).repeat_interleave(t)
        hi = lo + first.repeat_interleave(t) + row  # (T,) row i sees length + i + 1 keys
        return arena, PrefillMask.build(lo, hi)

    def attend_spans(self, layer, q, k, v, spans, plan, scale) -> Tensor:
        if plan is None:
            return super().attend_spans(layer, q, k, v, spans, plan, scale)
        from corps.engine.kernels.flex_prefill import flex_prefill

        arena, mask = plan
        for sp in spans:
            sp.view.append(layer, k[sp.start : sp.end], v[sp.start : sp.end])
        return flex_prefill(q, arena.k_layers[layer], arena.v_layers[layer], mask, scale)


class TritonFlexAttention(TritonAttention, FlexAttention):
    """The CUDA default: Triton gathers and decode, FlexAttention prefill."""

    name = "triton+flex"


def select_backend(device: torch.device | str) -> AttentionBackend:
    """The backend for `device`, or the one `CORPS_ATTENTION` names.

    Raises InvalidRequest for an unknown name, and for Triton when it is not
    installed or has neither a CUDA device nor its interpreter (TRITON_INTERPRET=1).
    """
    dev = torch.device(device)
    name = os.environ.get("CORPS_ATTENTION", "").strip().lower()
    if not name:
        name = "triton+flex" if dev.type == "cuda" and triton_available() else "torch"
    if name not in BACKENDS:
        raise InvalidRequest(f"CORPS_ATTENTION must be one of {', '.join(BACKENDS)}, got {name!r}")
    if "triton" in name:
        if not triton_available():
            raise InvalidRequest(f"CORPS_ATTENTION={name} needs Triton: pip install 'corps[cuda]'")
        if dev.type != "cuda" and not interpreting():
            raise InvalidRequest(
                f"CORPS_ATTENTION={name} on {dev.type} needs TRITON_INTERPRET=1 "
                "(Triton's interpreter: exact but slow, for testing); or use torch"
            )
    classes = {
        "torch": SdpaAttention,
        "triton": TritonAttention,
        "flex": FlexAttention,
        "triton+flex": TritonFlexAttention,
    }
    return classes[name]()
