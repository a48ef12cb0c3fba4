"""The CUDA backends: Triton kernels for gathers and decode, FlexAttention for prefill
(run on CPU only under Triton's interpreter, in tests)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from corps.cache.arena import ViewArena
from corps.engine.attention.plan import DecodePlan
from corps.engine.attention.sdpa import SdpaAttention


class TritonAttention(SdpaAttention):
    """Gathers with `gather_rotate` and decodes with `decode_attention` (Triton); prefill
    stays on the torch reference."""

    name = "triton"
    decode_min_calls = 1
    short_span_rows = 1  # the decode kernel takes one row per call
    plan_keys = None  # the decode kernel reads each view to its own length: no padding

    def gather(self, store_k, store_v, slots, positions, cos, sin, out_k, out_v) -> None:
        from corps.engine.kernels.gather_rotate import gather_rotate

        gather_rotate(store_k, store_v, slots, positions, cos, sin, out_k, out_v)

    def attend_decode(self, layer, q, k, v, plan: DecodePlan, scale: float) -> Tensor:
        from corps.engine.kernels.decode_attention import decode_attention

        ak, av = plan.append(layer, k, v)  # (Hkv, A, D)
        return decode_attention(
            q, ak, av, plan.ctx_base, plan.lengths, scale,
            max_n=plan.longest, ctx_len=plan.ctx_len, own_base=plan.own_base,
            splits=plan.splits,
        )  # fmt: skip


@dataclass(frozen=True)
class FlexPlan:
    """A step's FlexAttention prefill: the arena every span's view lives in, and the
    block mask of all the step's rows over it."""

    arena: ViewArena
    mask: Any  # corps.engine.kernels.flex_prefill.PrefillMask
    dest: Tensor  # (T,) the arena position each of the step's rows is written to


@dataclass(frozen=True)
class DensePlan:
    """A step of one span whose keys are arena positions [start, end) back to back
    (its context, if any, right before its own tokens): dense causal attention."""

    arena: ViewArena
    start: int
    end: int  # after the span's rows are appended
    mask: Any = None  # dense_prefill.lower_right_mask of the span's rows over its keys


def dense_plan(spans) -> DensePlan | None:
    """The DensePlan of a step of one span over one contiguous run of the arena (a
    prompt without parents, or whose context sits right before it), else None."""
    if len(spans) != 1 or spans[0].at is not None or spans[0].view.arena is None:
        return None
    sp, view = spans[0], spans[0].view
    if view.ctx_len and view.ctx_base + view.ctx_len != view.own_base:
        return None
    from corps.engine.kernels.dense_prefill import lower_right_mask

    rows = sp.end - sp.start
    end = view.own_base + view.own_length + rows
    mask = lower_right_mask(rows, end - view.ctx_base, view.arena.k.device)
    return DensePlan(view.arena, view.ctx_base, end, mask)


class FlexAttention(SdpaAttention):
    """Prefill with FlexAttention: all of a step's rows in one launch over the view
    arena, under a block mask built once per step. A step of one span over one
    contiguous run of the arena (a prompt without parents) runs dense causal
    attention instead (`dense_prefill`: flash attention, no mask to build). Steps
    whose views are not all in the arena (views built without one, as the attention
    sink's) use the torch reference."""

    name = "flex"
    short_span_rows = 1  # FlexAttention batches every prefill span in one launch

    def plan_prefill(self, spans) -> Any:
        from corps.engine.kernels.flex_prefill import PrefillMask

        arena = spans[0].view.arena
        if arena is None or any(sp.view.arena is not arena or sp.at is not None for sp in spans):
            return super().plan_prefill(spans)  # the torch reference's per-span masks
        dense = dense_plan(spans)
        if dense is not None:
            return dense
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
        # compiled (on CUDA), its shapes padded to fewer variants: fewer compiles
        size = arena.k.shape[2] if dev.type == "cuda" else None  # (L, Hkv, A, D)
        mask = PrefillMask.build(lo, lo + cl.repeat_interleave(t), own_lo, own_hi, size)
        return FlexPlan(arena, mask, own_hi - 1)  # row i is written where it last sees

    def attend_spans(self, layer, q, k, v, spans, plan, scale) -> Tensor:
        if isinstance(plan, DensePlan):
            from corps.engine.kernels.dense_prefill import dense_prefill

            rows = slice(spans[0].start, spans[0].end)
            spans[0].view.append(layer, k[rows], v[rows])
            ak = plan.arena.k_layers[layer][:, plan.start : plan.end]  # (Hkv, W, D)
            av = plan.arena.v_layers[layer][:, plan.start : plan.end]
            return dense_prefill(q[rows], ak, av, scale, plan.mask)
        if not isinstance(plan, FlexPlan):  # views outside the arena: the torch reference
            return super().attend_spans(layer, q, k, v, spans, plan, scale)
        from corps.engine.kernels.flex_prefill import flex_prefill

        ak, av = plan.arena.k_layers[layer], plan.arena.v_layers[layer]  # (Hkv, A, D)
        # every span's rows at once (what each view's `append` would write): two
        # launches a layer, not two per span
        ak.index_copy_(1, plan.dest, k.transpose(0, 1))
        av.index_copy_(1, plan.dest, v.transpose(0, 1))
        return flex_prefill(q, ak, av, plan.mask, scale)


class TritonFlexAttention(TritonAttention, FlexAttention):
    """The CUDA default: Triton gathers and decode, FlexAttention prefill."""

    name = "triton+flex"
