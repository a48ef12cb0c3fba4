"""engine/kernels/flex_prefill.py: FlexAttention prefill over the arena under one block
mask per step, against the brute-force reference, eager and compiled on CPU."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from corps.engine.kernels.flex_prefill import (
    BLOCK,
    PrefillMask,
    flex_prefill,
    padded_rows,
    padded_window,
    prefill_attention_ref,
)


@st.composite
def steps(draw):
    """A step's rows: per call a view at some arena base, a context and t new tokens."""
    calls = draw(
        st.lists(st.tuples(st.integers(0, 40), st.integers(1, 12)), min_size=1, max_size=4)
    )
    lo, hi, base = [], [], draw(st.integers(0, 7))
    for ctx, t in calls:
        lo += [base] * t
        hi += range(base + ctx + 1, base + ctx + t + 1)  # row i sees context + i + 1 tokens
        base += ctx + t + draw(st.integers(0, 9))
    return dict(
        lo=torch.tensor(lo),
        hi=torch.tensor(hi),
        size=base + 3,
        kv_heads=draw(st.sampled_from([1, 2])),
        group=draw(st.sampled_from([1, 3, 4])),
        seed=draw(st.integers(0, 2**16)),
    )


@settings(max_examples=25, deadline=None)
@given(steps())
def test_eager_flex_matches_reference(step):
    g = torch.Generator().manual_seed(step["seed"])
    hkv = step["kv_heads"]
    ak = torch.randn(hkv, step["size"], 64, generator=g)  # (Hkv, A, D)
    av = torch.randn(hkv, step["size"], 64, generator=g)
    q = torch.randn(step["lo"].numel(), hkv * step["group"], 64, generator=g)  # (T, Hq, D)
    mask = PrefillMask.build(step["lo"], step["hi"])
    got = flex_prefill(q, ak, av, mask, 0.125, compiled=False)
    want = prefill_attention_ref(q, ak, av, step["lo"], step["hi"], 0.125)
    assert torch.allclose(got, want, atol=1e-5)


def test_compiled_flex_matches_reference_on_cpu():
    """The path CUDA takes (torch.compile of flex_attention), compiled here by inductor's
    CPU backend: three calls, one with 0 context, overlapping GQA heads."""
    g = torch.Generator().manual_seed(1)
    lo = torch.tensor([0] * 4 + [20] * 6 + [140] * 3)
    hi = torch.tensor([1, 2, 3, 4, *range(118, 124), 141, 142, 143])
    ak, av = torch.randn(2, 160, 64, generator=g), torch.randn(2, 160, 64, generator=g)
    q = torch.randn(13, 6, 64, generator=g)
    got = flex_prefill(q, ak, av, PrefillMask.build(lo, hi), 0.125, compiled=True)
    assert torch.allclose(got, prefill_attention_ref(q, ak, av, lo, hi, 0.125), atol=1e-5)


def test_mask_covers_only_the_window_the_step_touches():
    mask = PrefillMask.build(torch.tensor([50, 50, 90]), torch.tensor([61, 62, 95]))
    assert (mask.start, mask.end) == (50, 95)


def test_compiled_steps_take_the_main_kernel_whatever_their_rows(monkeypatch):
    """Below 128 query rows inductor would pick FlexAttention's decoding template, which
    cannot lower grouped-query steps (group 4, as Llama-3's): compiled, every step asks
    for the main kernel; eager (CPU) asks nothing."""
    from corps.engine.kernels import flex_prefill as fp

    seen = []

    def fake(compiled):
        def run(q, k, v, **kw):
            seen.append((compiled, kw["kernel_options"], kw["enable_gqa"]))
            return q

        return run

    monkeypatch.setattr(fp, "_flex", fake)
    q = torch.randn(5, 32, 16)  # 5 rows, 32 query heads over 8 kv heads
    arena = torch.randn(8, 40, 16)
    mask = PrefillMask.build(torch.zeros(5, dtype=torch.long), torch.full((5,), 30))
    flex_prefill(q, arena, arena, mask, 0.25, compiled=True)
    flex_prefill(q, arena, arena, mask, 0.25, compiled=False)
    assert seen == [(True, {"FORCE_USE_FLEX_ATTENTION": True}, True), (False, None, True)]


@settings(max_examples=25, deadline=None)
@given(steps(), st.integers(0, 300))
def test_padded_shapes_give_the_same_rows(step, extra):
    """Padded for the compiled kernel (rows to whole blocks, the key window to two
    blocks where the arena allows), the step's rows are what they were."""
    g = torch.Generator().manual_seed(step["seed"])
    size, hkv = step["size"] + extra, step["kv_heads"]
    ak, av = torch.randn(hkv, size, 64, generator=g), torch.randn(hkv, size, 64, generator=g)
    q = torch.randn(step["lo"].numel(), hkv * step["group"], 64, generator=g)
    mask = PrefillMask.build(step["lo"], step["hi"], arena_size=size)
    assert mask.q_len % BLOCK == 0 and mask.q_len >= max(BLOCK, q.shape[0])
    assert mask.end - mask.start == min(size, max(2 * BLOCK, mask.end - mask.start))
    got = flex_prefill(q, ak, av, mask, 0.125, compiled=False)
    want = prefill_attention_ref(q, ak, av, step["lo"], step["hi"], 0.125)
    assert torch.allclose(got, want, atol=1e-5)


def test_padding_leaves_a_window_inside_the_arena():
    assert padded_window(10, 40, 1000) == (10, 266)  # widened forward
    assert padded_window(900, 990, 1000) == (744, 1000)  # ... and back at the arena's end
    assert padded_window(0, 30, 100) == (0, 100)  # a small arena: all of it
    assert padded_rows(torch.arange(3)).tolist() == [0, 1, 2] + [0] * (BLOCK - 3)
