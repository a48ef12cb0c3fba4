"""The reference backend on torch ops: SDPA for prefill spans, two matmuls for
batched decodes, and the exact two-part attention over a shared context."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from corps.cache.view import CallView
from corps.engine.attention.plan import PLAN_KEYS, DecodePlan
from corps.engine.kernels.gather_rotate import gather_rotate_ref


class SdpaAttention:
    """Reference backend on torch ops (SDPA for prefill, two matmuls for decode)."""

    name = "torch"
    decode_min_calls = 2
    #: Prefill spans of at most this many rows may be attended together through
    #: `attend_decode`, as decodes are (the runner says when); longer ones go to SDPA.
    short_span_rows = 32
    #: A decode plan pads every call to the longest view it holds, so a step's decodes
    #: are split into plans of similar lengths while that saves more than this many
    #: padded keys, about what a plan costs of its own (`routing.split_by_length`).
    plan_keys: int | None = PLAN_KEYS

    def gather(self, store_k, store_v, slots, positions, cos, sin, out_k, out_v) -> None:
        gather_rotate_ref(store_k, store_v, slots, positions, cos, sin, out_k, out_v)

    def plan_prefill(self, spans) -> tuple[Tensor | None, ...]:
        """Each span's causal mask, built once per step for all layers (`causal_mask`,
        `repair_mask` for repair rows)."""
        return tuple(
            causal_mask(sp.end - sp.start, sp.view, sp.view.own_k.dtype)
            if sp.at is None
            else repair_mask(sp.at, sp.view.length, sp.view.own_k.dtype)
            for sp in spans
        )

    def attend_spans(self, layer, q, k, v, spans, plan, scale) -> Tensor:
        """Each span appends to and attends through its own view, one at a time (repair
        rows write inside the view and see it up to themselves, `attend_repair`);
        `plan` is `plan_prefill(spans)`."""
        outs = []
        for sp, mask in zip(spans, plan, strict=True):
            rows = slice(sp.start, sp.end)
            if sp.at is not None:
                outs.append(attend_repair(layer, q[rows], k[rows], v[rows], sp, mask, scale))
                continue
            sp.view.append(layer, k[rows], v[rows])
            outs.append(self.attend(layer, q[rows], sp.view, scale, mask))
        return outs[0] if len(outs) == 1 else torch.cat(outs)  # (T, Hq, D)

    def attend_decode(
        self, layer: int, q: Tensor, k: Tensor, v: Tensor, plan: DecodePlan, scale: float
    ) -> Tensor:
        """The rows of B calls, t_b each (one per decode): q (T, Hq, D), new k, v (T, Hkv, D).

        Appends every row's new key/value with one index_copy_ and attends over all
        gathered parts at once, padded to the longest and masked (causally within a
        span). A group of calls sharing a context reads it once, with one matmul for
        all of them, and the two parts' softmax are merged exactly (a shared maximum,
        summed numerators and normalisers). Returns (T, Hq, D).
        """
        ak, av = plan.append(layer, k, v)  # (Hkv, A, D)
        hq, d = q.shape[1:]
        b, t = plan.ctx_len.shape[0], plan.t
        hkv = ak.shape[0]
        g = hq // hkv
        if plan.padded is not None:  # spans of several rows: pad each to t rows
            q = q.new_zeros(b * t, hq, d).index_copy_(0, plan.padded, q)  # (B t, Hq, D)
        keys, values = plan.gathered(ak), plan.gathered(av)  # (Hkv, B, N, D) each
        qg = (q * scale).view(b, t, hkv, g, d).permute(2, 0, 1, 3, 4)  # (Hkv, B, t, G, D)
        qg = qg.reshape(hkv, b, t * g, d)  # rows ordered (span row, head in group)
        scores = (qg @ keys.transpose(-1, -2)).view(hkv, b, t, g, -1)  # (Hkv, B, t, G, N)
        scores = scores.masked_fill(~plan.mask[None, :, :, None, :], float("-inf"))
        scores = scores.view(hkv, b, t * g, -1)  # (Hkv, B, t G, N)
        if not plan.groups:
            out = torch.softmax(scores, dim=-1) @ values  # (Hkv, B, t G, D)
            return self._rows(out, plan, hq, d)
        shared = []
        top = scores.amax(-1)  # (Hkv, B, t G)
        for ctx, ix in plan.groups:
            qi = qg.index_select(1, ix).reshape(hkv, -1, d)  # (Hkv, Bg t G, D)
            ck, cv = ctx.layer(layer)  # (Hkv, C, D) each
            s = torch.bmm(qi, ck.transpose(1, 2))  # (Hkv, Bg t G, C)
            s = s.view(hkv, len(ix), t * g, -1)  # (Hkv, Bg, t G, C)
            top[:, ix] = torch.maximum(top[:, ix], s.amax(-1))
            shared.append((s, cv))
        e = torch.exp(scores - top[..., None])  # (Hkv, B, t G, N), 0 where masked
        num = e @ values  # (Hkv, B, t G, D)
        den = e.sum(-1)  # (Hkv, B, t G)
        for (_, ix), (s, cv) in zip(plan.groups, shared, strict=True):
            es = torch.exp(s - top[:, ix, :, None])  # (Hkv, Bg, t G, C)
            part = torch.bmm(es.view(hkv, -1, es.shape[-1]), cv)
            num[:, ix] += part.view(hkv, len(ix), t * g, d)  # (Hkv, Bg t G, D) per group
            den[:, ix] += es.sum(-1)
        return self._rows(num / den[..., None], plan, hq, d)

    @staticmethod
    def _rows(out: Tensor, plan: DecodePlan, hq: int, d: int) -> Tensor:
        """(Hkv, B, t G, D) attention output as (T, Hq, D) rows, padding dropped."""
        hkv, b = out.shape[:2]
        out = out.view(hkv, b, plan.t, hq // hkv, d).permute(1, 2, 0, 3, 4)  # (B, t, Hkv, G, D)
        out = out.reshape(b * plan.t, hq, d)  # (B t, Hq, D)
        return out if plan.padded is None else out.index_select(0, plan.padded)

    def attend(
        self, layer: int, q: Tensor, view: CallView, scale: float, mask: Tensor | None = None
    ) -> Tensor:
        """Per call, grouped-query attention without copying K/V. `mask` is
        `causal_mask(t, view)` when the caller has it (built once for every layer)."""
        t, hq, d = q.shape
        n = view.length + t
        if t > 1 and mask is None:
            mask = causal_mask(t, view, q.dtype)
        if not view.contiguous:
            own = view.own_length + t
            return attend_parts(
                q,
                *view.ctx.layer(layer),
                view.own_k_layers[layer][:, :own],
                view.own_v_layers[layer][:, :own],
                scale,
                mask,
            )
        k = view.k_layers[layer][:, :n]  # (Hkv, n, D)
        v = view.v_layers[layer][:, :n]  # (Hkv, n, D)
        hkv = k.shape[0]
        g = hq // hkv
        if t == 1:  # decode: every key is visible, two small matmuls beat SDPA's overhead
            qg = q.view(hkv, g, d) * scale  # (Hkv, G, D)
            probs = torch.softmax(torch.bmm(qg, k.transpose(1, 2)), dim=-1)  # (Hkv, G, n)
            return torch.bmm(probs, v).view(1, hq, d)
        # Query i sees keys [0, view.length + i]: causal, aligned to the bottom right.
        # SDPA takes its fused flash kernel with this additive mask on CPU, and gives the
        # same bits as with a `causal_lower_right` bias, which it would rebuild per layer.
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None],  # (1, Hq, t, D)
            k[None],  # (1, Hkv, n, D)
            v[None],
            attn_mask=mask,
            scale=scale,
            enable_gqa=g > 1,
        )  # (1, Hq, t, D)
        return out[0].transpose(0, 1)  # (t, Hq, D)


def causal_mask(t: int, view: CallView, dtype: torch.dtype = torch.float32) -> Tensor | None:
    """Which keys each of t new rows of `view` sees, as an additive mask (0 where
    visible, -inf where not): (t, n) over the whole view (n = its length + t) when it
    is one range, else (t, M) over its own part (M = own length + t; the shared
    context is visible to all). Row i sees up to the view's current length + i. None
    for one row, which sees everything. Additive, because SDPA turns a boolean mask
    into this on every call; built once, it serves every layer of a step."""
    if t == 1:
        return None
    n = view.length + t if view.contiguous else view.own_length + t
    dev = view.own_k.device
    hidden = torch.arange(n, device=dev)[None, :] > (n - t + torch.arange(t, device=dev))[:, None]
    return torch.zeros(hidden.shape, dtype=dtype, device=dev).masked_fill_(hidden, float("-inf"))


def repair_mask(at: Tensor, n: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """Additive mask (t, n) of repair rows at view indices `at` (t,) over a view of n
    keys: row i sees the keys up to and including its own index."""
    hidden = torch.arange(n, device=at.device)[None, :] > at[:, None]
    return torch.zeros(hidden.shape, dtype=dtype, device=at.device).masked_fill_(
        hidden, float("-inf")
    )


def attend_repair(
    layer: int, q: Tensor, k: Tensor, v: Tensor, span, mask: Tensor, scale: float
) -> Tensor:
    """Repair rows of one call (`corps.engine.exec.repairs`): write their rotated keys
    and values k, v (t, Hkv, D) over the view's at the span's indices, then attend
    their queries q (t, Hq, D) over the view's context, row i up to its own index
    (`mask`, `repair_mask`). The view is the call's own (one range). (t, Hq, D)."""
    view = span.view
    n = view.length
    keys, values = view.k_layers[layer], view.v_layers[layer]  # (Hkv, C + E, D)
    keys.index_copy_(1, span.at, k.transpose(0, 1))
    values.index_copy_(1, span.at, v.transpose(0, 1))
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None],  # (1, Hq, t, D)
        keys[None, :, :n],  # (1, Hkv, n, D)
        values[None, :, :n],
        attn_mask=mask,
        scale=scale,
        enable_gqa=q.shape[1] != keys.shape[0],
    )  # (1, Hq, t, D)
    return out[0].transpose(0, 1)  # (t, Hq, D)


def attend_parts(
    q: Tensor, ck: Tensor, cv: Tensor, ok: Tensor, ov: Tensor, scale: float, mask: Tensor | None
) -> Tensor:
    """Attention of t queries q (t, Hq, D) over a context ck, cv (Hkv, C, D), all
    visible, then own tokens ok, ov (Hkv, M, D), M >= t, where query i sees the
    first M - t + i + 1: `mask` (t, M) is the additive `causal_mask` (None for one
    query). The two parts' softmax merge exactly. Returns (t, Hq, D).
    """
    t, hq, d = q.shape
    hkv = ck.shape[0]
    g = hq // hkv
    qg = (q * scale).view(t, hkv, g, d).permute(1, 2, 0, 3).reshape(hkv, g * t, d)  # (Hkv, G t, D)
    sc = torch.bmm(qg, ck.transpose(1, 2))  # (Hkv, G t, C)
    so = torch.bmm(qg, ok.transpose(1, 2))  # (Hkv, G t, M)
    if t > 1:
        m = ok.shape[1]
        so = (so.view(hkv, g, t, m) + mask).view(hkv, g * t, m)  # + 0 is exact
    top = torch.maximum(sc.amax(-1), so.amax(-1))[..., None]  # (Hkv, G t, 1)
    ec, eo = torch.exp(sc - top), torch.exp(so - top)
    out = (torch.bmm(ec, cv) + torch.bmm(eo, ov)) / (ec.sum(-1) + eo.sum(-1))[..., None]
    return out.view(hkv, g, t, d).permute(2, 0, 1, 3).reshape(t, hq, d)  # (t, Hq, D)
