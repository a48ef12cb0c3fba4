"""engine/kernels/dense_prefill.py: dense causal prefill of one span over a contiguous
run of the arena, against the brute-force reference (property test over the span's
rows, its prefix, grouped-query heads); and which steps the flex backend sends there
(engine/attention/cuda.py `dense_plan`)."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from corps.engine.attention.cuda import dense_plan
from corps.engine.kernels.dense_prefill import dense_prefill, lower_right_mask
from corps.engine.kernels.flex_prefill import prefill_attention_ref


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 24),
    prefix=st.integers(0, 40),
    kv_heads=st.sampled_from([1, 2]),
    group=st.sampled_from([1, 3, 4]),
    seed=st.integers(0, 2**16),
)
def test_dense_matches_reference(rows, prefix, kv_heads, group, seed):
    g = torch.Generator().manual_seed(seed)
    w = prefix + rows
    k, v = torch.randn(kv_heads, w, 64, generator=g), torch.randn(kv_heads, w, 64, generator=g)
    q = torch.randn(rows, kv_heads * group, 64, generator=g)  # (T, Hq, D)
    lo = torch.zeros(rows, dtype=torch.long)
    hi = torch.arange(prefix + 1, w + 1)  # row i sees the prefix and rows 0..i
    want = prefill_attention_ref(q, k, v, lo, hi, 0.125)
    mask = lower_right_mask(rows, w, q.device)
    assert torch.allclose(dense_prefill(q, k, v, 0.125, mask), want, atol=1e-5)


ARENA = SimpleNamespace(k=torch.empty(0))


def span(ctx_base, ctx_len, own_base, own_length, rows, arena=ARENA, at=None):
    view = SimpleNamespace(
        arena=arena, ctx_base=ctx_base, ctx_len=ctx_len, own_base=own_base,
        own_length=own_length,
    )  # fmt: skip
    return SimpleNamespace(view=view, start=0, end=rows, at=at)


def test_one_span_over_a_contiguous_run_is_dense():
    plan = dense_plan((span(8, 0, 8, 0, 5),))  # no parents: plain causal
    assert (plan.arena, plan.start, plan.end, plan.mask) == (ARENA, 8, 13, None)
    plan = dense_plan((span(0, 8, 8, 3, 5),))  # its context right before it
    assert (plan.start, plan.end) == (0, 16)
    assert plan.mask.shape == (5, 16) and plan.mask[0, :12].all() and not plan.mask[0, 12:].any()


def test_other_steps_keep_the_block_mask():
    assert dense_plan((span(0, 8, 20, 0, 5),)) is None  # a shared context elsewhere
    assert dense_plan((span(8, 0, 8, 0, 5), span(30, 0, 30, 0, 2))) is None  # two spans
    assert dense_plan((span(8, 0, 8, 0, 5, at=3),)) is None  # repair rows
    assert dense_plan((span(8, 0, 8, 0, 5, arena=None),)) is None  # a view off the arena
