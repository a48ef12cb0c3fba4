"""Our transformer forward over HF weights, attending through per-call views of the store."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Protocol

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
    repair_mask,
    split_step,
)
from corps.engine.kernels import rms_norm as fused_norm
from corps.engine.kernels import rope as fused_rope
from corps.engine.kernels import triton_available
from corps.engine.model.weights import Weights


class CompiledStep(Protocol):
    """A lone one-row decode step through a captured graph (`model.compiled_decode`)."""

    steps: dict[str, int]  # steps it ran, by kind of view
    compile_seconds: float

    def parts(self, batch: ForwardBatch) -> tuple | None: ...

    def forward(self, batch: ForwardBatch, *parts: Any) -> Tensor: ...


class StaticSteps(Protocol):
    """Decode-only steps over static buffers, CUDA graphs on a GPU (`model.static_decode`)."""

    steps: dict  # the buffers (and graph) of each bucket
    runs: int  # steps run through them
    capture_seconds: float

    def key(self, batch: ForwardBatch) -> tuple[int, int | None] | None: ...

    def forward(self, batch: ForwardBatch, key: tuple[int, int | None]) -> Tensor: ...

    def release(self) -> None: ...


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
        self.compiled: CompiledStep | None = None
        # decode-only steps over static buffers, CUDA graphs on a GPU (EngineConfig.graphs)
        self.static: StaticSteps | None = None

    def release(self) -> None:
        """Drop the weights and the captured step (the engine closed): their memory
        goes back as soon as nothing else holds them."""
        self.w = None
        self.compiled = None
        if self.static is not None:  # its buffers and graphs go; its counts stay readable
            self.static.release()

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> Tensor:
        """Encode the batch, write its K/V to the store and views, return logits (N, V)."""
        if self.compiled is not None and (parts := self.compiled.parts(batch)) is not None:
            logits = self.compiled.forward(batch, *parts)
            if logits is not None:
                return logits
        if self.static is not None and (key := self.static.key(batch)) is not None:
            return self.static.forward(batch, key)
        w = self.w
        if w.lora is not None:  # the rows an adapter kept apart applies to, or None
            w.lora.set(adapted_rows(batch), batch.input_ids.shape[0])
        split = split_step(
            self.attention, batch.spans, batch.input_ids.device, self.group_min_saved
        )
        attention, scale = self.attention, self.scale

        def attend(i: int, q: Tensor, k_rot: Tensor, v: Tensor) -> Tensor:
            return split.attend(attention, i, q, k_rot, v, scale)  # (T, Hq, D)

        x = self.layers(batch.input_ids, batch.positions, batch.slots, attend)
        for span in batch.spans:
            if span.at is None:  # repair rows rewrite the view; they do not extend it
                span.view.advance(span.end - span.start)
        return self.logits(x[batch.logit_rows])  # (N, V)

    def layers(self, ids: Tensor, positions: Tensor, slots: Tensor, attend) -> Tensor:
        """Every decoder layer over tokens `ids` (T,) at `positions` (T,): each layer
        writes its unrotated K/V to the store at `slots` (T,) and attends through
        `attend(layer, q, k_rot, v) -> (T, Hq, D)`. The last hidden states (T, E)."""
        spec, w = self.spec, self.w
        x = w.embedding(ids)  # (T, E)
        cos = w.rope.cos[positions].unsqueeze(1)  # (T, 1, D)
        sin = w.rope.sin[positions].unsqueeze(1)  # (T, 1, D)
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
            self.store.write(i, slots, k, v)
            attn = attend(i, q, k_rot, v)  # (T, Hq, D)
            x = layer_mlp(
                x, attn.reshape(q.shape[0], -1), lw.o, lw.post_norm, lw.gate_up, lw.down,
                spec.rms_norm_eps,
            )  # fmt: skip
        return x

    @torch.inference_mode()
    def deviation(self, items: list[tuple], layer: int) -> list[Tensor]:
        """For each (view, ids, positions, at) in `items`: how far recomputing tokens
        `ids` (R,) at `positions`, view indices `at`, in the context of `view` moves
        their keys and values of `layer`: per token, the norm of the change of its
        rotated key plus that of its value (R,) float32 (`corps.engine.exec.repairs`).
        The layers before run as repair rows would (each token over its view up to
        itself, every probed token recomputed), over copies of the views' layers: the
        views are left as they were. All items' rows share each projection and MLP;
        attention runs per view."""
        spec, w = self.spec, self.w
        dev = items[0][0].own_k.device
        x, cos, sin, bounds = self._probe_rows(items, dev)
        ats = [torch.tensor(at, device=dev) for _, _, _, at in items]
        masks = [repair_mask(at, view.length, view.own_k.dtype) for (view, *_), at in
                 zip(items, ats, strict=True)]  # (R_i, n_i) each  # fmt: skip
        for i in range(layer + 1):
            lw = w.layers[i]
            q, k_rot, _, v = self._probe_qkv(lw, x, cos, sin)
            out = []
            for (view, *_), at, mask, a, b in zip(items, ats, masks, bounds[:-1], bounds[1:],
                                                  strict=True):  # fmt: skip
                n = view.length
                keys, values = view.k_layers[i][:, :n], view.v_layers[i][:, :n]  # (Hkv, n, D)
                if i == layer:
                    dk = k_rot[a:b] - keys[:, at].transpose(0, 1)  # (R_i, Hkv, D)
                    dv = v[a:b] - values[:, at].transpose(0, 1)
                    out.append(
                        dk.float().flatten(1).norm(dim=1) + dv.float().flatten(1).norm(dim=1)
                    )
                    continue
                keys = keys.index_copy(1, at, k_rot[a:b].transpose(0, 1))  # copies
                values = values.index_copy(1, at, v[a:b].transpose(0, 1))
                out.append(F.scaled_dot_product_attention(
                    q[a:b].transpose(0, 1)[None], keys[None], values[None], attn_mask=mask,
                    scale=self.scale, enable_gqa=spec.num_heads != spec.num_kv_heads,
                )[0].transpose(0, 1))  # (R_i, Hq, D)  # fmt: skip
            if i == layer:
                return out
            attn = torch.cat(out)  # (R, Hq, D)
            x = layer_mlp(
                x, attn.reshape(len(x), -1), lw.o, lw.post_norm, lw.gate_up, lw.down,
                spec.rms_norm_eps,
            )  # fmt: skip
        raise ValueError(f"layer {layer} is past the model's {len(w.layers)} layers")

    def _probe_rows(self, items: list[tuple], dev) -> tuple[Tensor, Tensor, Tensor, list[int]]:
        """The rows of every item of a probe (`deviation`, `query_attention`: ids and
        positions second and third in each) as one batch: their embeddings (R, E), RoPE
        cos and sin (R, 1, D), and where each item's rows start and end. The probe runs
        the base weights (an adapter kept apart is off for its rows)."""
        w = self.w
        ids_t = torch.tensor([t for _, ids, *_ in items for t in ids], device=dev)
        pos_t = torch.tensor([p for _, _, pos, *_ in items for p in pos], device=dev)
        bounds = list(itertools.accumulate([len(ids) for _, ids, *_ in items], initial=0))
        if w.lora is not None:
            w.lora.set(None, len(ids_t))
        cos, sin = w.rope.cos[pos_t].unsqueeze(1), w.rope.sin[pos_t].unsqueeze(1)
        return w.embedding(ids_t), cos, sin, bounds

    def _probe_qkv(self, lw, x: Tensor, cos: Tensor, sin: Tensor):
        """A probe's q, rotated k, k and v of layer `lw` for its rows `x` (R, E)."""
        spec = self.spec
        return layer_qkv(
            x, lw.input_norm, lw.qkv, lw.q_norm, lw.k_norm, cos, sin, spec.num_heads,
            spec.num_kv_heads, spec.rms_norm_eps,
        )  # fmt: skip

    @torch.inference_mode()
    def query_attention(self, items: list[tuple], layer: int) -> list[Tensor]:
        """For each (view, ids, positions, at, every) in `items`: the attention query
        rows `ids` (R,) at `positions` pay the view's tokens at indices `every` (K,),
        summed over heads, rows and layers 0..`layer` (K,) float32 ("query:R",
        `corps.engine.exec.repairs`). A row at view index `at` attends to the view
        up to itself; one at `at` >= the view's length (the call's own new tokens)
        to all of it. The rows run from their embeddings through those layers over
        the view's keys and values as they are (nothing is written). All items' rows
        share each projection and MLP; attention runs per view."""
        spec, w = self.spec, self.w
        dev = items[0][0].own_k.device
        x, cos, sin, bounds = self._probe_rows(items, dev)
        group = spec.num_heads // spec.num_kv_heads
        scores = [torch.zeros(len(every), device=dev) for *_, every in items]
        # what each row sees: the view up to itself (the call's own rows: all of it)
        seen = [torch.arange(view.length, device=dev)[None, :]
                <= torch.tensor(at, device=dev)[:, None]
                for view, _, _, at, _ in items]  # (R_i, n_i) each  # fmt: skip
        for i in range(layer + 1):
            lw = w.layers[i]
            q, _, _, _ = self._probe_qkv(lw, x, cos, sin)
            out = []
            for (view, *_, every), mask, score, a, b in zip(items, seen, scores, bounds[:-1],
                                                              bounds[1:], strict=True):  # fmt: skip
                n = view.length
                keys = view.k_layers[i][:, :n].repeat_interleave(group, 0)  # (Hq, n, D)
                values = view.v_layers[i][:, :n].repeat_interleave(group, 0)
                logits = q[a:b].transpose(0, 1).float() @ keys.float().transpose(1, 2)
                probs = torch.softmax((logits * self.scale).masked_fill(~mask, float("-inf")), -1)
                score += probs[:, :, every].sum((0, 1))  # (Hq, R, n) -> (K,)
                out.append((probs.to(values.dtype) @ values).transpose(0, 1))  # (R_i, Hq, D)
            if i == layer:
                return scores
            x = layer_mlp(
                x, torch.cat(out).reshape(len(x), -1), lw.o, lw.post_norm, lw.gate_up,
                lw.down, spec.rms_norm_eps,
            )  # fmt: skip
        raise ValueError(f"layer {layer} is past the model's {len(w.layers)} layers")

    def logits(self, x: Tensor) -> Tensor:
        """Next-token logits (N, V) of hidden states x (N, E)."""
        w = self.w
        return w.lm_head(rms_norm(x, w.final_norm, self.spec.rms_norm_eps))


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
    qk = rotate(qk, cos, sin)  # one rotation for q and k
    return qk[:, :hq], qk[:, hq:], k, v


def layer_mlp(x, attn, o_proj, norm, gate_up_proj, down_proj, eps: float):
    """Residual attention output, then the SiLU MLP, for x (T, E) and attn (T, Hq D)."""
    x = x + o_proj(attn)
    a = rms_norm(x, norm, eps)
    gate, up = gate_up_proj(a).chunk(2, dim=-1)  # (T, I) each
    return x + down_proj(F.silu(gate) * up)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """`apply_rope` of a step's (T, H, D) queries and keys; on CUDA one Triton launch
    where it takes them (`corps.engine.kernels.rope`: 16 bits, the same rounding)
    instead of five."""
    if x.is_cuda and fused_rope.takes(x, cos) and triton_available():
        return fused_rope.rope_fused(x, cos, sin)
    return apply_rope(x, cos, sin)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm over the last dim as HF computes it (in float32, then back to x's dtype).

    Written out because F.rms_norm took ~36 us per call here, mostly dtype copies. On
    CUDA in 16 bits, one Triton launch (`corps.engine.kernels.rms_norm`) instead of
    eight: a GPU's decode step is bound by its launches.
    """
    if x.is_cuda and fused_norm.takes(x, weight) and triton_available():
        return fused_norm.rms_norm_fused(x, weight, eps)
    if x.dtype == torch.float32:
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
