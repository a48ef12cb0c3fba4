"""engine/kernels/rope.py: the one-launch rotation against `corps.cache.rope.apply_rope`
(transformers' op-by-op rounding), by Triton's interpreter on a CPU
(`pytest --device cuda`: on the GPU)."""

from __future__ import annotations

import pytest
import torch

from corps.cache.rope import apply_rope
from corps.engine.kernels.rope import rope_fused

from conftest import DEVICE

pytest.importorskip("triton")

SHAPES = [(1, 40, 64), (7, 12, 128), (0, 4, 64), (3, 5, 32)]


def inputs(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    t, heads, dim = shape
    qkv = torch.randn(t, heads + 3, dim, generator=g) * 2
    x = qkv[:, :heads]  # rows of heads + 3, as q and k come out of the fused projection
    ang = torch.rand(t, 1, dim // 2, generator=g) * 50
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)  # (T, 1, D)
    return (u.to(dtype).to(DEVICE) for u in (x, cos, sin))


@pytest.mark.parametrize("shape", SHAPES)
def test_float16_matches_the_reference_bit_for_bit(shape):
    x, cos, sin = inputs(shape, torch.float16)
    assert torch.equal(rope_fused(x, cos, sin), apply_rope(x, cos, sin))


@pytest.mark.parametrize("shape", SHAPES)
def test_bfloat16_matches_up_to_the_interpreters_truncation(shape):
    """Bit for bit on a GPU; Triton's interpreter truncates its casts to bfloat16 (three
    roundings here), so on a CPU within a few units in the last place."""
    x, cos, sin = inputs(shape, torch.bfloat16, seed=1)
    got, want = rope_fused(x, cos, sin), apply_rope(x, cos, sin)
    if DEVICE == "cuda":
        assert torch.equal(got, want)
    else:
        scale = x.float().abs().amax(-1, keepdim=True) + 1e-30
        assert ((got.float() - want.float()).abs() <= scale * 4 * 2.0**-7).all()


def test_wrong_inputs_are_refused():
    x, cos, sin = inputs((2, 3, 64), torch.float16)
    with pytest.raises(ValueError, match="16-bit"):
        rope_fused(x.float(), cos.float(), sin.float())
    with pytest.raises(ValueError, match="power of two"):
        rope_fused(*inputs((2, 3, 48), torch.float16))
