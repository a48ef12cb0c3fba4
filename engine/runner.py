"""Our transformer forward over HF weights, attending through per-call views of the store."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from corps.cache.kv import KVStore
from corps.cache.rope import apply_rope
from corps.cache.view import CallView
from corps.engine.attention import GROUP_MIN_SAVED, AttentionBackend, DecodePlan, SdpaAttention
from corps.engine.weights import Weights

#: Short spans are batched only while their padded scores stay this small per query
#: head (x 4 bytes x heads: ~38 MB for this model family's 9 heads), since padding
#: every span to the longest one grows with the product; one by one they stay small.
SHORT_SPAN_PAIRS = 1 << 20


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

    def __init__(
        self,
        weights: Weights,
        store: KVStore,
        attention: AttentionBackend | None = None,
    ) -> None:
        self.w = weights
        self.spec = weights.spec
        self.store = store
        self.attention = attention or SdpaAttention()
        self.scale = self.spec.head_dim**-0.5
        # decode steps read a context once for its readers when that saves this many keys
        self.group_min_saved: int | None = GROUP_MIN_SAVED

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> Tensor:
        """Encode the batch, write its K/V to the store and views, return logits (N, V)."""
        spec, w = self.spec, self.w
        x = w.embed[batch.input_ids].to(w.dtype)  # (T, E)
        split = self._split(batch)
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

    def _split(self, batch: ForwardBatch) -> StepSplit:
        """How this step's rows attend. Decodes (one-row spans) go through one batched
        plan over the arena when they can; so do short prefill spans (role headers)
        when some of them read a shared context, as sixteen voters' headers over one
        set of branches do: per span, those are the slow two-part attention (measured
        here per layer: 8 spans over a shared 72-token context 0.9 ms batched against
        1.9 ms, 16 over 1100 tokens 8.2 against 11.8), while spans over contexts of
        their own are as fast through SDPA one by one. The rest (long prefill chunks)
        go through the backend's span attention; a mixed step keeps every path."""
        att, spans = self.attention, batch.spans
        batched = self._batched(spans)
        taken = {id(sp) for group, _ in batched for sp in group}
        rest = tuple(sp for sp in spans if id(sp) not in taken)
        if not batched:
            return StepSplit((StepPart(None, None, spans, att.plan_prefill(spans)),))
        if not rest and len(batched) == 1:  # every row through one plan, in batch order
            return StepSplit((StepPart(None, batched[0][1]),))
        dev = batch.input_ids.device
        parts = [StepPart(_rows(group, dev), plan) for group, plan in batched]
        if rest:
            renum = _renumbered(rest)
            parts.append(StepPart(_rows(rest, dev), None, renum, att.plan_prefill(renum)))
        return StepSplit(tuple(parts))

    def _batched(self, spans) -> list[tuple[list[SeqSpan], DecodePlan]]:
        """The spans attended through a batched plan, with their plan: the decodes,
        then the short spans when some read a shared context and their padded scores
        stay under SHORT_SPAN_PAIRS."""
        att = self.attention
        ones = [sp for sp in spans if sp.end - sp.start == 1]
        short = [sp for sp in spans if 1 < sp.end - sp.start <= att.short_span_rows]
        if all(sp.view.contiguous for sp in short) or _padded_pairs(short) > SHORT_SPAN_PAIRS:
            short = []
        out = []
        for group, min_calls in ((ones, att.decode_min_calls), (short, 2)):
            if group:
                rows = [sp.end - sp.start for sp in group]
                views = [sp.view for sp in group]
                plan = DecodePlan.of(views, min_calls, self.group_min_saved, rows)
                if plan is not None:
                    out.append((group, plan))
        return out


def _padded_pairs(spans: list[SeqSpan]) -> int:
    """(row, key) pairs a batched plan over these spans scores per query head: every
    span padded to the most rows and the longest view."""
    if not spans:
        return 0
    rows = max(sp.end - sp.start for sp in spans)
    return len(spans) * rows * max(sp.view.length + rows for sp in spans)


def _rows(spans, device) -> Tensor:
    """(T,) the step's rows of these spans, span after span."""
    return torch.tensor([r for sp in spans for r in range(sp.start, sp.end)], device=device)


def _renumbered(spans) -> tuple[SeqSpan, ...]:
    """The spans numbered over their own rows, in order (for attending them apart)."""
    out, t = [], 0
    for sp in spans:
        out.append(SeqSpan(t, t + sp.end - sp.start, sp.view))
        t += sp.end - sp.start
    return tuple(out)


@dataclass(frozen=True)
class StepPart:
    """Some of a step's rows and how they attend: one batched plan (decodes, short
    spans), or span by span with the backend's prefill plan."""

    rows: Tensor | None  # (Tp,) its rows of the step, span after span; None: all, in order
    plan: DecodePlan | None  # None: the spans attend one by one
    spans: tuple[SeqSpan, ...] = ()  # without a plan: its spans, over its own rows
    prefill: Any = None  # the backend's prefill plan for those spans

    def attend(self, attention: AttentionBackend, layer: int, q, k, v, scale: float) -> Tensor:
        """Output (Tp, Hq, D) of the part's rows q (Tp, Hq, D), k, v (Tp, Hkv, D)."""
        if self.plan is not None:
            return attention.attend_decode(layer, q, k, v, self.plan, scale)
        return attention.attend_spans(layer, q, k, v, self.spans, self.prefill, scale)


@dataclass(frozen=True)
class StepSplit:
    """One step's rows split in parts, each attended its own way."""

    parts: tuple[StepPart, ...]

    def attend(self, attention: AttentionBackend, layer: int, q, k, v, scale: float) -> Tensor:
        """Attention output (T, Hq, D) of every row; q (T, Hq, D), k, v (T, Hkv, D)."""
        if len(self.parts) == 1 and self.parts[0].rows is None:
            return self.parts[0].attend(attention, layer, q, k, v, scale)
        out = torch.empty_like(q)
        for part in self.parts:
            r = part.rows
            out.index_copy_(0, r, part.attend(attention, layer, q[r], k[r], v[r], scale))
        return out


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
