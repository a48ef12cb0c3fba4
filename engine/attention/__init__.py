"""Attention over calls' views, in one place: building a call's view of its context,
routing a step's rows, and attending them on every backend.

- `views.py`: a call's view of the store (`open_view`): its context rotated once
  into the view arena (`SharedContext`), or read from the store at every step
  (`StoreContext`, keys rotated one layer at a time), plus room for its own tokens.
- `routing.py`: which rows of a step attend through one batched plan and which
  span by span (`split_step`).
- `plan.py`: the batched plan (`DecodePlan`).
- `backend.py`: the interface every backend implements, and `select_backend`
  (by device, or by name: `EngineConfig.attention`, default from `CORPS_ATTENTION`).
- `sdpa.py`: the torch reference backend; `cuda.py`: Triton kernels and
  FlexAttention. The kernels and their torch references live in
  `corps.engine.kernels`. Every backend computes the same thing.
"""

from corps.engine.attention.backend import BACKENDS, AttentionBackend, select_backend
from corps.engine.attention.cuda import (
    FlexAttention,
    FlexPlan,
    TritonAttention,
    TritonFlexAttention,
)
from corps.engine.attention.plan import GROUP_MIN_SAVED, DecodePlan
from corps.engine.attention.routing import SHORT_SPAN_PAIRS, SeqSpan, StepSplit, split_step
from corps.engine.attention.sdpa import SdpaAttention, attend_parts, causal_mask, repair_mask

__all__ = [
    "BACKENDS",
    "GROUP_MIN_SAVED",
    "SHORT_SPAN_PAIRS",
    "AttentionBackend",
    "DecodePlan",
    "FlexAttention",
    "FlexPlan",
    "SdpaAttention",
    "SeqSpan",
    "StepSplit",
    "TritonAttention",
    "TritonFlexAttention",
    "attend_parts",
    "causal_mask",
    "repair_mask",
    "select_backend",
    "split_step",
]
