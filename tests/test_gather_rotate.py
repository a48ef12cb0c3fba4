"""engine/kernels/gather_rotate.py: the Triton kernel (interpreted on CPU) against its
torch reference, and the reference against RopeTables.rotate."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from corps.cache.rope import RopeTables
from corps.engine.kernels.gather_rotate import gather_rotate, gather_rotate_ref

pytest.importorskip("triton")

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def rope_tables(positions: int, dim: int, dtype) -> RopeTables:
    inv = 1.0 / 10000 ** (torch.arange(0, dim, 2).float() / dim)  # (D/2,)
    ang = torch.arange(positions).float()[:, None] * inv[None]  # (P, D/2)
    ang = torch.cat([ang, ang], dim=-1)  # (P, D)
    return RopeTables(cos=ang.cos().to(dtype), sin=ang.sin().to(dtype))


@st.composite
def cases(draw):
    return dict(
        layers=draw(st.integers(1, 3)),
        heads=draw(st.sampled_from([1, 2, 3])),
        dim=draw(st.sampled_from([64, 128])),
        store=draw(st.integers(1, 24)),
        count=draw(st.integers(0, 20)),
        offset=draw(st.integers(0, 5)),  # where the view starts inside a larger arena
        dtype=draw(st.sampled_from([torch.float32, torch.bfloat16])),
        seed=draw(st.integers(0, 2**16)),
    )


@settings(max_examples=30, deadline=None)
@given(cases())
def test_kernel_matches_reference(case):
    g = torch.Generator().manual_seed(case["seed"])
    L, H, D, S, C, dt = (case[k] for k in ("layers", "heads", "dim", "store", "count", "dtype"))
    sk = torch.randn(L, S, H, D, generator=g).to(dt)  # (L, S, Hkv, D)
    sv = torch.randn(L, S, H, D, generator=g).to(dt)
    slots = torch.randint(0, S, (C,), generator=g)  # repeated and unordered slots
    positions = torch.randint(0, 64, (C,), generator=g)
    rope = rope_tables(64, D, dt)
    off = case["offset"]
    outs = []
    for fn in (gather_rotate, gather_rotate_ref):
        arena_k = torch.full((L, H, off + C + 3, D), 7.0, dtype=dt)  # (L, Hkv, A, D)
        arena_v = torch.full_like(arena_k, 7.0)
        k, v = arena_k[:, :, off : off + C + 3], arena_v[:, :, off : off + C + 3]
        fn(sk, sv, slots, positions, rope.cos, rope.sin, k, v)
        outs.append((arena_k, arena_v))
    (k1, v1), (k2, v2) = outs
    assert torch.allclose(k1.float(), k2.float(), atol=TOL[dt], rtol=TOL[dt])
    assert torch.equal(v1, v2)
    assert (k1[:, :, :off] == 7).all() and (k1[:, :, off + C :] == 7).all()  # nothing else


def test_reference_is_rope_rotate():
    rope = rope_tables(32, 64, torch.float32)
    sk, sv = torch.randn(2, 10, 2, 64), torch.randn(2, 10, 2, 64)
    slots, pos = torch.tensor([3, 3, 9, 0]), torch.tensor([5, 0, 31, 7])
    k, v = torch.empty(2, 2, 4, 64), torch.empty(2, 2, 4, 64)
    gather_rotate_ref(sk, sv, slots, pos, rope.cos, rope.sin, k, v)
    assert torch.equal(k, rope.rotate(sk[:, slots], pos).transpose(1, 2))
    assert torch.equal(v, sv[:, slots].transpose(1, 2))


def test_kernel_rejects_what_it_cannot_do():
    rope = rope_tables(8, 48, torch.float32)
    sk = torch.randn(1, 4, 1, 48)
    out = torch.empty(1, 1, 2, 48)
    with pytest.raises(ValueError, match="power-of-two"):
        gather_rotate(
            sk, sk, torch.tensor([0, 1]), torch.tensor([0, 1]), rope.cos, rope.sin, out, out
        )


def test_rotate_into_a_strided_view_is_bitwise_rotate():
    """The view gather rotates straight into the arena's (L, Hkv, C, D) layout in four
    passes; it must equal RopeTables.rotate bit for bit (positions repeat, any order)."""
    g = torch.Generator().manual_seed(3)
    angles = torch.arange(64)[:, None].float() * torch.rand(8, generator=g)[None]  # (P, D)
    rope = RopeTables(cos=angles.cos(), sin=angles.sin())
    x = torch.randn(2, 5, 3, 8, generator=g)  # (L, C, Hkv, D)
    positions = torch.tensor([9, 0, 63, 9, 1])
    out = torch.full((2, 3, 7, 8), float("nan"))  # (L, Hkv, >= C, D), as the arena holds it
    rope.rotate_into(x, positions, out[:, :, :5].transpose(1, 2))
    assert torch.equal(out[:, :, :5].transpose(1, 2), rope.rotate(x, positions))
    assert out[:, :, 5:].isnan().all()  # nothing written past the context
    head_major = torch.full_like(out, float("nan"))
    rope.rotate_into(x.transpose(1, 2), positions, head_major[:, :, :5], token_dim=-2)
    assert torch.equal(head_major[:, :, :5], out[:, :, :5])  # (L, Hkv, C, D) in, same bits
    assert head_major[:, :, 5:].isnan().all()
    with pytest.raises(ValueError, match="token_dim"):
        rope.rotate_into(x, positions, out[:, :, :5], token_dim=-1)
