"""Our transformer forward over HF weights, attending through per-call views of the store."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from corps.cache.kv import KVStore
from corps.cache.rope import apply_rope
from corps.engine.attention import (
    GROUP_MIN_SAVED,
    AttentionBackend,
    SdpaAttention,
    SeqSpan,
    split_step,
)
from corps.engine.model.weights import Weights

if TYPE_CHECKING:
    from corps.engine.model.compiled_decode import CompiledDecode


@dataclass(frozen=True)
class ForwardBatch:
    """A flat batch of new tokens from any number of calls.

    Each token has a logical position and a store slot where its (unrotated)
    K/V is written; each span of rows belongs to one call and attends to that
    call's view (its parents, at the positions the call chose) plus its own
    earlier tokens.
    """

    input_ids: Tensor  # (T,) long
    positions: Tensor  # (T,) long
    slots: Tensor  # (T,) long, store slots to write
    spans: tuple[SeqSpan, ...]
    logit_rows: Tensor  # (N,) long, rows whose next-token logits are wanted


class ModelRunner:
    """Runs forward steps of one model over one KV store."""

    def __init__(
        self,
        weights: Weights,
        store: KVStore,
        attention: AttentionBackend | None = None,
    ) -> None:
        self.w = weights
        self.weight_bytes = weights.nbytes  # kept for stats() once the weights are gone
        self.spec = weights.spec
        self.store = store
        self.attention = attention or SdpaAttention()
        self.scale = self.spec.head_dim**-0.5
        # decode steps read a context once for its readers when that saves this many keys
        self.group_min_saved: int | None = GROUP_MIN_SAVED
        # lone one-row steps through a captured graph (EngineConfig.compile), else None
        self.compiled: CompiledDecode | None = None

    def release(self) -> None:
        """Drop the weights and the captured step (the engine closed): their memory
        goes back as soon as nothing else holds them."""
        self.w = None
        self.compiled = None

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> Tensor:
        """Encode the batch, write its K/V to the store and views, return logits (N, V)."""
        if self.compiled is not None and (parts := self.compiled.parts(batch)) is not None:
            logits = self.compiled.forward(batch, *parts)
            if logits is not None:
                return logits
        spec, w = self.spec, self.w
        if w.lora is not None:  # the rows an adapter kept apart applies to, or None
            w.lora.set(adapted_rows(batch), batch.input_ids.shape[0])
        x = w.embed[batch.input_ids].to(w.dtype)  # (T, E)
        split = split_step(
            self.attention, batch.spans, batch.input_ids.device, self.group_min_saved
        )
        cos = w.rope.cos[batch.positions].unsqueeze(1)  # (T, 1, D)
        sin = w.rope.sin[batch.positions].unsqueeze(1)  # (T, 1, D)
        for i, lw in enumerate(w.layers):
            q, k_rot, k, v = layer_qkv(
                x,
                lw.input_norm,
                lw.qkv,
                lw.q_norm,
                lw.k_norm,
                cos,
                sin,
                spec.num_heads,
                spec.num_kv_heads,
                spec.rms_norm_eps,
            )
            self.store.write(i, batch.slots, k, v)
            attn = split.attend(self.attention, i, q, k_rot, v, self.scale)  # (T, Hq, D)
            x = layer_mlp(
                x, attn.reshape(q.shape[0], -1), lw.o, lw.post_norm, lw.gate_up, lw.down,
                spec.rms_norm_eps,
            )  # fmt: skip
        for span in batch.spans:
            span.view.advance(span.end - span.start)
        h = rms_norm(x[batch.logit_rows], w.final_norm, spec.rms_norm_eps)
        return w.lm_head(h)  # (N, V)


def adapted_rows(batch: ForwardBatch) -> Tensor | None:
    """The rows (R,) of the batch's adapted spans, or None when it has none."""
    rows = [r for s in batch.spans if s.adapted for r in range(s.start, s.end)]
    return torch.tensor(rows, device=batch.input_ids.device) if rows else None


def layer_qkv(x, norm, qkv_proj, q_norm, k_norm, cos, sin, hq: int, hkv: int, eps: float):
    """Attention inputs of one layer for x (T, E).

    Returns q rotated (T, Hq, D), k rotated (T, Hkv, D), k unrotated and v (T, Hkv, D).
    """
    d = cos.shape[-1]
    a = rms_norm(x, norm, eps)  # (T, E)
    qkv = qkv_proj(a)  # (T, (Hq + 2 Hkv) D)
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    k = k.view(-1, hkv, d)
    v = v.view(-1, hkv, d)
    if q_norm is None:
        qk = qkv[:, : (hq + hkv) * d].view(-1, hq + hkv, d)  # (T, Hq + Hkv, D)
    else:
        q = rms_norm(q.view(-1, hq, d), q_norm, eps)
        k = rms_norm(k, k_norm, eps)
        qk = torch.cat([q, k], dim=1)
    qk = apply_rope(qk, cos, sin)  # one rotation for q and k
    return qk[:, :hq], qk[:, hq:], k, v


def layer_mlp(x, attn, o_proj, norm, gate_up_proj, down_proj, eps: float):
    """Residual attention output, then the SiLU MLP, for x (T, E) and attn (T, Hq D)."""
    x = x + o_proj(attn)
    a = rms_norm(x, norm, eps)
    gate, up = gate_up_proj(a).chunk(2, dim=-1)  # (T, I) each
    return x + down_proj(F.silu(gate) * up)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm over the last dim as HF computes it (in float32, then back to x's dtype).

    Written out because F.rms_norm took ~36 us per call here, mostly dtype copies.
    """
    if x.dtype == torch.float32:
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
