"""engine/kernels/rms_norm.py: the one-launch RMSNorm against the torch reference
(`_ref`: `corps.engine.model.runner.rms_norm`'s 16-bit path, transformers'
rounding), run by Triton's interpreter on a CPU (`pytest --device cuda`: on the GPU)."""

from __future__ import annotations

import pytest
import torch

from conftest import DEVICE

pytest.importorskip("triton")
from corps.engine.kernels.rms_norm import rms_norm_fused

SHAPES = [(5, 64), (3, 4, 32), (1, 576), (7, 100), (0, 64)]


def pair(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * 3).to(dtype).to(DEVICE)
    w = (torch.rand(shape[-1], generator=g) + 0.5).to(dtype).to(DEVICE)
    return x, w


@pytest.mark.parametrize("shape", SHAPES)
def test_float16_matches_the_reference_bit_for_bit(shape):
    x, w = pair(shape, torch.float16)
    assert torch.equal(rms_norm_fused(x, w, 1e-5), _ref(x, w))


@pytest.mark.parametrize("shape", SHAPES)
def test_bfloat16_is_within_the_last_places(shape):
    """On a GPU within one unit in the last place (the sums' order); Triton's
    interpreter truncates its casts to bfloat16, so on a CPU within two."""
    x, w = pair(shape, torch.bfloat16, seed=1)
    got, want = rms_norm_fused(x, w, 1e-5).float(), _ref(x, w).float()
    ulps = 1 if DEVICE == "cuda" else 2
    assert ((got - want).abs() <= want.abs() * ulps * 2.0**-7 + 1e-30).all()


def test_strided_rows_and_a_wrong_dtype():
    x, w = pair((6, 96), torch.float16)
    part = x[:, 16:80]  # rows of 64, 96 apart
    assert torch.equal(rms_norm_fused(part, w[:64], 1e-6), _ref(part, w[:64], 1e-6))
    with pytest.raises(ValueError, match="16-bit"):
        rms_norm_fused(x.float(), w.float(), 1e-6)


def _ref(x, w, eps=1e-5):
    """The torch path of `runner.rms_norm` for 16-bit x (which on CUDA takes the kernel)."""
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
