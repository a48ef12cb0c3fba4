"""Attention over calls' views: one small interface, a torch reference backend, and the
CUDA path (Triton kernels for gathers and decode, FlexAttention for prefill).

`select_backend(device, name)` picks by device (`cuda`: Triton + Flex; `cpu`: torch)
unless named (`EngineConfig.attention`: torch|triton|flex|triton+flex, default from
`CORPS_ATTENTION`). Every backend computes the
same thing; the kernels and their torch references live in `corps.engine.kernels`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from corps.cache.arena import ViewArena
from corps.cache.errors import InvalidRequest
from corps.cache.view import CallView
from corps.engine.kernels import interpreting, triton_available
from corps.engine.kernels.gather_rotate import gather_rotate_ref

BACKENDS = ("torch", "triton", "flex", "triton+flex")
#: Calls reading one context in a decode step form a group when grouping saves
#: gathering at least this many keys ((readers - 1) x context). Below it, the few
#: extra ops per group cost more than the copy they save (measured on CPU: break-even
#: near 750 keys, e.g. 16 readers of 64 tokens or 2 of 1024; 16 x 4096 is 24x faster).
GROUP_MIN_SAVED = 768


@dataclass(frozen=True)
class DecodePlan:
    """A batched step over B calls whose views all live in one arena (built once per step).

    Each call adds `t_b` rows: one for a decode, a few for a short prefill span (a
    role header, a short message). Rows are attended together, queries padded to
    the longest span (`t`), keys to the longest gathered part (`n`): one masked
    matmul per layer for every call instead of one attention per call.

    A view is a context (maybe shared) and an own part, each a range of the arena.
    Calls that share a context within this step form a group: its context is read
    once per step for all of them (`groups`), and only their own tokens are
    gathered; every other call's whole view is gathered, padded to N.
    """

    arena: ViewArena
    write: Tensor  # (T,) arena index of each new row, span after span
    gather: Tensor  # (B * N,) arena indices of each call's gathered keys, padded to N
    mask: Tensor  # (B, t, N) True where the row sees the gathered key
    n: int  # longest gathered part, new rows included
    ctx_base: Tensor  # (B,) arena index where each call's context starts
    ctx_len: Tensor  # (B,) tokens in each call's context
    own_base: Tensor  # (B,) arena index where each call's own tokens start
    lengths: Tensor  # (B,) each call's context + own tokens, new rows included
    longest: int  # max(lengths)
    groups: tuple[tuple[Any, Tensor], ...] = ()  # (SharedContext, (Bg,) call indices)
    t: int = 1  # rows of the longest span; 1 for a decode step
    padded: Tensor | None = None  # (T,) each row's index among the B x t padded rows

    @classmethod
    def of(
        cls,
        views: list[CallView],
        min_calls: int = 2,
        min_saved: int | None = GROUP_MIN_SAVED,
        rows: list[int] | None = None,
    ) -> DecodePlan | None:
        """The plan, or None when the step must take the per-call path. `rows` gives
        each call's new rows (default one each). Calls reading one context form a
        group (the torch backend reads it once) when that saves gathering `min_saved`
        keys or more; None never groups."""
        arena = views[0].batch_arena
        if len(views) < min_calls or arena is None:
            return None
        if any(v.batch_arena is not arena for v in views):
            return None
        in_store = [v.ctx is not None and v.ctx.in_store for v in views]
        if min_saved is None and any(in_store):  # such a context is only read as a group
            return None
        rows = rows or [1] * len(views)
        dev = arena.k.device  # index tensors live where the arena does
        readers: dict[int, list[int]] = {}
        for i, v in enumerate(views):
            if min_saved is not None and v.ctx is not None:
                readers.setdefault(id(v.ctx), []).append(i)
        grouped = [
            ix
            for ix in readers.values()
            if (len(ix) - 1) * views[ix[0]].ctx_len >= max(1, min_saved) or in_store[ix[0]]
        ]
        in_group = {i for ix in grouped for i in ix}
        cb = torch.tensor([v.ctx_base for v in views], device=dev)  # (B,)
        cl = torch.tensor([v.ctx_len for v in views], device=dev)  # (B,)
        ob = torch.tensor([v.own_base for v in views], device=dev)  # (B,)
        lengths = [v.length + r for v, r in zip(views, rows, strict=True)]  # with new rows
        n = torch.tensor(lengths, device=dev)  # (B,)
        # gathered part of each call: own tokens only in a group, else the whole view
        skips = [v.ctx_len if i in in_group else 0 for i, v in enumerate(views)]
        skip = torch.tensor(skips, device=dev)  # (B,)
        m = n - skip  # (B,) gathered keys
        width = max(a - b for a, b in zip(lengths, skips, strict=True))  # no device sync
        ar = torch.arange(width, device=dev)  # (N,)
        j = skip[:, None] + torch.minimum(ar[None, :], m[:, None] - 1)  # (B, N), pads repeat
        idx = torch.where(j < cl[:, None], cb[:, None] + j, ob[:, None] + j - cl[:, None])
        groups = tuple((views[ix[0]].ctx, torch.tensor(ix, device=dev)) for ix in grouped)
        # new rows go after each call's own tokens: own_base + own length + i
        first = [v.own_base + v.length - v.ctx_len for v in views]
        write = [f + i for f, r in zip(first, rows, strict=True) for i in range(r)]
        write = torch.tensor(write, device=dev)  # (T,)
        mask, padded = _row_masks(rows, m, width)
        return cls(arena, write, idx.flatten(), mask, width, cb, cl, ob, n,
                   max(lengths), groups, max(rows), padded)  # fmt: skip

    @cached_property
    def rows(self) -> Tensor:
        """(Hkv B N,) rows of a layer's arena seen as (Hkv A, D) that `gather` picks,
        for every KV head: a row lookup on dim 0 is 1.2-3.6x faster here than the
        same `index_select` on the arena's token dim (16 calls x 300 keys: 133 us
        against 165-479), twice per layer of every decode step."""
        heads, size = self.arena.k.shape[1:3]
        head = torch.arange(heads, device=self.gather.device) * size  # (Hkv,)
        return (head[:, None] + self.gather[None, :]).flatten()

    def gathered(self, arena_layer: Tensor) -> Tensor:
        """Each call's gathered keys (or values) of one layer: (Hkv, A, D) -> (Hkv, B, N, D)."""
        hkv, _, d = arena_layer.shape
        picked = arena_layer.view(-1, d).index_select(0, self.rows)  # (Hkv B N, D)
        return picked.view(hkv, self.ctx_len.shape[0], self.n, d)

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write the new rows' k, v (T, Hkv, D) into the arena; return the layer's
        arena keys and values (Hkv, A, D)."""
        ak, av = self.arena.k_layers[layer], self.arena.v_layers[layer]
        ak.index_copy_(1, self.write, k.transpose(0, 1))
        av.index_copy_(1, self.write, v.transpose(0, 1))
        return ak, av


def _row_masks(rows: list[int], m: Tensor, width: int) -> tuple[Tensor, Tensor | None]:
    """Which gathered keys each row sees, for calls adding `rows` (B,) rows over m (B,)
    gathered keys (new rows last), padded to `width`: (B, t, N), and each real row's
    index among the B x t padded rows (None when every call adds one row):
    row i of a t_b-row span sees the keys before m_b - (t_b - 1 - i); a padding row
    (i >= t_b) sees them all, so its softmax is defined (and dropped)."""
    dev = m.device
    ar = torch.arange(width, device=dev)  # (N,)
    t = max(rows)
    if t == 1:
        return (ar[None, :] < m[:, None])[:, None], None  # (B, 1, N)
    r = torch.tensor(rows, device=dev)  # (B,)
    ti = torch.arange(t, device=dev)  # (t,)
    seen = m[:, None] - (r[:, None] - 1 - ti[None, :]).clamp(min=0)  # (B, t)
    padded = [b * t + i for b, rb in enumerate(rows) for i in range(rb)]
    return ar[None, None, :] < seen[:, :, None], torch.tensor(padded, device=dev)  # (B, t, N)


class AttentionBackend(Protocol):
    name: str
    decode_min_calls: int  # decode steps of at least this many calls use attend_decode
    short_span_rows: int  # prefill spans this short may go to attend_decode too (1: none)

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
        """A step of B calls whose views share an arena, `plan.t` or fewer rows each
        (1 for decodes): append k, v (T, Hkv, D) and attend q (T, Hq, D) over each
        call's view, causally within its rows. Returns (T, Hq, D)."""
        ...


class SdpaAttention:
    """Reference backend on torch ops (SDPA for prefill, two matmuls for decode)."""

    name = "torch"
    decode_min_calls = 2
    #: Prefill spans of at most this many rows may be attended together through
    #: `attend_decode`, as decodes are (the runner says when); longer ones go to SDPA.
    short_span_rows = 32

    def gather(self, store_k, store_v, slots, positions, cos, sin, out_k, out_v) -> None:
        gather_rotate_ref(store_k, store_v, slots, positions, cos, sin, out_k, out_v)

    def plan_prefill(self, spans) -> tuple[Tensor | None, ...]:
        """Each span's causal mask, built once per step for all layers (`causal_mask`)."""
        return tuple(causal_mask(sp.end - sp.start, sp.view, sp.view.own_k.dtype) for sp in spans)

    def attend_spans(self, layer, q, k, v, spans, plan, scale) -> Tensor:
        """Each span appends to and attends through its own view, one at a time;
        `plan` is `plan_prefill(spans)`."""
        outs = []
        for sp, mask in zip(spans, plan, strict=True):
            sp.view.append(layer, k[sp.start : sp.end], v[sp.start : sp.end])
            outs.append(self.attend(layer, q[sp.start : sp.end], sp.view, scale, mask))
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


class TritonAttention(SdpaAttention):
    """Gathers with `gather_rotate` and decodes with `decode_attention` (Triton); prefill
    stays on the torch reference."""

    name = "triton"
    decode_min_calls = 1
    short_span_rows = 1  # the decode kernel takes one row per call

    def gather(self, store_k, store_v, slots, positions, cos, sin, out_k, out_v) -> None:
        from corps.engine.kernels.gather_rotate import gather_rotate

        gather_rotate(store_k, store_v, slots, positions, cos, sin, out_k, out_v)

    def attend_decode(self, layer, q, k, v, plan: DecodePlan, scale: float) -> Tensor:
        from corps.engine.kernels.decode_attention import decode_attention

        ak, av = plan.append(layer, k, v)  # (Hkv, A, D)
        return decode_attention(
            q, ak, av, plan.ctx_base, plan.lengths, scale,
            max_n=plan.longest, ctx_len=plan.ctx_len, own_base=plan.own_base,
        )  # fmt: skip


@dataclass(frozen=True)
class FlexPlan:
    """A step's FlexAttention prefill: the arena every span's view lives in, and the
    block mask of all the step's rows over it."""

    arena: ViewArena
    mask: Any  # corps.engine.kernels.flex_prefill.PrefillMask


class FlexAttention(SdpaAttention):
    """Prefill with FlexAttention: all of a step's rows in one launch over the view
    arena, under a block mask built once per step. Steps whose views are not all in
    the arena (views built without one, as the attention sink's) use the torch
    reference."""

    name = "flex"
    short_span_rows = 1  # FlexAttention batches every prefill span in one launch

    def plan_prefill(self, spans) -> Any:
        from corps.engine.kernels.flex_prefill import PrefillMask

        arena = spans[0].view.arena
        if arena is None or any(sp.view.arena is not arena for sp in spans):
            return super().plan_prefill(spans)  # the torch reference's per-span masks
        dev = arena.k.device
        views = [sp.view for sp in spans]
        t = torch.tensor([sp.end - sp.start for sp in spans], device=dev)  # (S,) rows
        cb = torch.tensor([v.ctx_base for v in views], device=dev)  # (S,)
        cl = torch.tensor([v.ctx_len for v in views], device=dev)  # (S,)
        ob = torch.tensor([v.own_base for v in views], device=dev)  # (S,)
        first = torch.tensor([v.own_length + 1 for v in views], device=dev)  # (S,)
        row = torch.arange(int(t.sum()), device=dev) - (torch.cumsum(t, 0) - t).repeat_interleave(t)
        lo = cb.repeat_interleave(t)  # (T,) each row's context
        own_lo = ob.repeat_interleave(t)  # (T,) each row's own tokens
        own_hi = own_lo + first.repeat_interleave(t) + row  # row i sees own_length + i + 1
        return FlexPlan(arena, PrefillMask.build(lo, lo + cl.repeat_interleave(t), own_lo, own_hi))

    def attend_spans(self, layer, q, k, v, spans, plan, scale) -> Tensor:
        if not isinstance(plan, FlexPlan):  # views outside the arena: the torch reference
            return super().attend_spans(layer, q, k, v, spans, plan, scale)
        from corps.engine.kernels.flex_prefill import flex_prefill

        arena, mask = plan.arena, plan.mask
        for sp in spans:
            sp.view.append(layer, k[sp.start : sp.end], v[sp.start : sp.end])
        return flex_prefill(q, arena.k_layers[layer], arena.v_layers[layer], mask, scale)


class TritonFlexAttention(TritonAttention, FlexAttention):
    """The CUDA default: Triton gathers and decode, FlexAttention prefill."""

    name = "triton+flex"


def select_backend(device: torch.device | str, name: str | None = None) -> AttentionBackend:
    """The backend `name` (`EngineConfig.attention`, default from `CORPS_ATTENTION`), or
    with None the one that suits `device`.

    Raises InvalidRequest for an unknown name, and for Triton when it is not
    installed or has neither a CUDA device nor its interpreter (TRITON_INTERPRET=1).
    """
    dev = torch.device(device)
    name = (name or "").strip().lower()
    if not name:
        name = "triton+flex" if dev.type == "cuda" and triton_available() else "torch"
    if name not in BACKENDS:
        raise InvalidRequest(f"attention must be one of {', '.join(BACKENDS)}, got {name!r}")
    if "triton" in name:
        if not triton_available():
            raise InvalidRequest(f"attention {name!r} needs Triton: pip install 'corps[cuda]'")
        if dev.type != "cuda" and not interpreting():
            raise InvalidRequest(
                f"attention {name!r} on {dev.type} needs TRITON_INTERPRET=1 "
                "(Triton's interpreter: exact but slow, for testing); or use torch"
            )
    classes = {
        "torch": SdpaAttention,
        "triton": TritonAttention,
        "flex": FlexAttention,
        "triton+flex": TritonFlexAttention,
    }
    return classes[name]()
