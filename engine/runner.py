"""Our transformer forward over HF weights, attending through per-call views of the store."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from corps.cache.kv import KVStore
from corps.cache.rope import rotate_half
from corps.cache.view import CallView
from corps.engine.attention import AttentionBackend, SdpaAttention
from corps.engine.weights import Weights


@dataclass(frozen=True)
class SeqSpan:
    """Rows [start, end) of a flat batch that extend one call's view."""

    start: int
    end: int
    view: CallView


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

    def __init__(self, weights: Weights, store: KVStore, attention: AttentionBackend | None = None):
        self.w = weights
        self.spec = weights.spec
        self.store = store
        self.attention = attention or SdpaAttention()
        self.scale = self.spec.head_dim**-0.5

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> Tensor:
        """Encode the batch, write its K/V to the store and views, return logits (N, V)."""
        spec, w = self.spec, self.w
        hq, hkv, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
        eps = spec.rms_norm_eps
        x = w.embed[batch.input_ids]  # (T, E)
        pos = batch.positions
        cos = w.rope.cos[pos].unsqueeze(1)  # (T, 1, D)
        sin = w.rope.sin[pos].unsqueeze(1)  # (T, 1, D)
        for i, lw in enumerate(w.layers):
            a = F.rms_norm(x, (x.shape[-1],), lw.input_norm, eps)  # (T, E)
            qkv = F.linear(a, lw.wqkv, lw.bqkv)  # (T, (Hq + 2 Hkv) D)
            q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
            k = k.view(-1, hkv, d)  # (T, Hkv, D), unrotated
            v = v.view(-1, hkv, d)  # (T, Hkv, D)
            if lw.q_norm is None:
                qk = qkv[:, : (hq + hkv) * d].view(-1, hq + hkv, d)  # (T, Hq + Hkv, D)
            else:
                q = F.rms_norm(q.view(-1, hq, d), (d,), lw.q_norm, eps)
                k = F.rms_norm(k, (d,), lw.k_norm, eps)
                qk = torch.cat([q, k], dim=1)  # (T, Hq + Hkv, D)
            self.store.write(i, batch.slots, k, v)
            qk = qk * cos + rotate_half(qk) * sin  # one rotation for q and k
            q, k = qk[:, :hq], qk[:, hq:]  # (T, Hq, D), (T, Hkv, D)
            x = x + F.linear(self._attend(i, q, k, v, batch.spans), lw.wo)  # (T, E)
            a = F.rms_norm(x, (x.shape[-1],), lw.post_norm, eps)
            gate, up = F.linear(a, lw.w_gate_up).chunk(2, dim=-1)  # (T, I) each
            x = x + F.linear(F.silu(gate) * up, lw.w_down)
        for span in batch.spans:
            span.view.advance(span.end - span.start)
        h = F.rms_norm(x[batch.logit_rows], (x.shape[-1],), w.final_norm, eps)  # (N, E)
        return F.linear(h, w.lm_head)  # (N, V)

    def _attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, spans) -> Tensor:
        if len(spans) == 1 and spans[0].start == 0 and spans[0].end == q.shape[0]:
            return self._attend_span(layer, q, k, v, spans[0]).reshape(q.shape[0], -1)
        out = torch.empty_like(q)  # (T, Hq, D)
        for span in spans:
            s, e = span.start, span.end
            out[s:e] = self._attend_span(layer, q[s:e], k[s:e], v[s:e], span)
        return out.view(q.shape[0], -1)  # (T, Hq D)

    def _attend_span(self, layer: int, q: Tensor, k: Tensor, v: Tensor, span: SeqSpan) -> Tensor:
        span.view.append(layer, k, v)
        return self.attention.attend(layer, q, span.view, self.scale)
