"""engine/kernels/decode_attention.py: flash-decoding in Triton (interpreted on CPU)
against the brute-force reference, and the reference against the torch backend."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from corps.engine.kernels.decode_attention import SPLIT, decode_attention, decode_attention_ref

from helpers import shared_views

pytest.importorskip("triton")

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


@st.composite
def cases(draw):
    calls = draw(st.integers(1, 4))
    # context lengths without the new token: 0 and 1 included, some past one split
    ctx = st.one_of(st.sampled_from([0, 1, SPLIT - 1, SPLIT]), st.integers(0, 2 * SPLIT + 40))
    return dict(
        ctx=draw(st.lists(ctx, min_size=calls, max_size=calls)),
        kv_heads=draw(st.sampled_from([1, 2])),
        group=draw(st.sampled_from([1, 3, 4, 8])),
        dim=draw(st.sampled_from([64, 128])),
        dtype=draw(st.sampled_from([torch.float32, torch.bfloat16])),
        seed=draw(st.integers(0, 2**16)),
        # None: splits of SPLIT keys from the longest; else that many per view (graphs)
        splits=draw(st.sampled_from([None, 1, 3, 16])),
    )


def arena_for(ctx: list[int], heads: int, dim: int, dtype, g):
    """Calls' views laid out in one arena with gaps between them."""
    n = torch.tensor([c + 1 for c in ctx])  # (B,) the new token included
    gaps = torch.randint(0, 5, (len(ctx),), generator=g)
    base = torch.cumsum(gaps, 0) + torch.cumsum(n, 0) - n  # (B,)
    size = int((base + n).max()) + 3
    ak = torch.randn(heads, size, dim, generator=g).to(dtype)  # (Hkv, A, D)
    av = torch.randn(heads, size, dim, generator=g).to(dtype)
    return ak, av, base, n


@settings(max_examples=25, deadline=None)
@given(cases())
def test_kernel_matches_reference(case):
    g = torch.Generator().manual_seed(case["seed"])
    dt, hkv, d = case["dtype"], case["kv_heads"], case["dim"]
    ak, av, base, n = arena_for(case["ctx"], hkv, d, dt, g)
    q = torch.randn(len(case["ctx"]), hkv * case["group"], d, generator=g).to(dt)
    scale = d**-0.5
    got = decode_attention(q, ak, av, base, n, scale, splits=case["splits"])
    want = decode_attention_ref(q, ak, av, base, n, scale)
    assert got.dtype == q.dtype and got.shape == q.shape
    assert torch.allclose(got.float(), want.float(), atol=TOL[dt], rtol=TOL[dt])


def test_shared_contexts_are_held_once_and_given_back():
    arena, pool, views, _ = shared_views(extra=3)
    assert len(pool) == 2 and pool.tokens == 5 + 17
    assert views[3].ctx is views[0].ctx and views[4].ctx is views[1].ctx
    assert [v.contiguous for v in views] == [True, True, True, False, False]
    assert arena.free_tokens == 256 - (5 + 17) - 5 * 3
    for v in views:
        v.release()
        v.release()  # idempotent
    assert len(pool) == 0 and pool.tokens == 0 and arena.free_tokens == 256


def test_reference_matches_the_torch_backend_over_shared_contexts():
    from corps.engine.attention import DecodePlan, SdpaAttention

    arena, _, views, g = shared_views()
    assert not DecodePlan.of(views).groups  # too short to be worth a group by default
    plan = DecodePlan.of(views, min_saved=1)
    assert len(plan.groups) == 2  # each shared context is read once for its two calls
    q = torch.randn(5, 8, 64, generator=g)
    k_new, v_new = torch.randn(5, 2, 64, generator=g), torch.randn(5, 2, 64, generator=g)
    ours = SdpaAttention().attend_decode(0, q, k_new, v_new, plan, 0.125)
    args = (plan.ctx_base, plan.lengths, 0.125, plan.ctx_len, plan.own_base)
    ref = decode_attention_ref(q, arena.k_layers[0], arena.v_layers[0], *args)
    assert torch.allclose(ours, ref, atol=1e-5)
    kernel = decode_attention(q, arena.k_layers[0], arena.v_layers[0], *args[:3], **dict(
        ctx_len=plan.ctx_len, own_base=plan.own_base
    ))  # fmt: skip
    assert torch.allclose(kernel, ref, atol=1e-5)
    ungrouped = DecodePlan.of(views, min_saved=None)  # every view gathered whole, padded
    assert not ungrouped.groups
    alone = SdpaAttention().attend_decode(0, q, k_new, v_new, ungrouped, 0.125)
    assert torch.allclose(alone, ref, atol=1e-5)
    for i, v in enumerate(views):  # the per-call path reads the same (new token written)
        one = SdpaAttention().attend(0, q[i : i + 1], v, 0.125)
        assert torch.allclose(one[0], ref[i], atol=1e-5)


def test_kernel_rejects_heads_that_do_not_group():
    with pytest.raises(ValueError, match="group"):
        q = torch.randn(1, 3, 64)
        ak = torch.randn(2, 4, 64)
        decode_attention(q, ak, ak, torch.tensor([0]), torch.tensor([4]), 1.0)
