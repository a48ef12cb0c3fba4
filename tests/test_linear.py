"""engine/linear.py: the projection's layouts, and mixed precision (bfloat16 multi-row)."""

from __future__ import annotations

import torch

from corps.engine.linear import Linear


def test_float32_keeps_both_layouts_and_both_agree():
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(48, 32, generator=g), torch.randn(48, generator=g)
    lin = Linear.of(w, b)
    assert lin.wt is not None and lin.w.dtype == torch.float32
    for rows in (1, 2, 7):
        x = torch.randn(rows, 32, generator=g)
        assert torch.allclose(lin(x), x @ w.T + b, atol=1e-5)


def test_mixed_precision_single_rows_exact_batches_in_bfloat16():
    g = torch.Generator().manual_seed(1)
    w, b = torch.randn(64, 96, generator=g), torch.randn(64, generator=g)
    lin = Linear.of(w, b, multi_row=torch.bfloat16)
    assert lin.w.dtype == torch.bfloat16 and lin.wt.dtype == torch.float32  # 1.5x, not 2x
    one = torch.randn(1, 96, generator=g)
    assert torch.equal(lin(one), one @ w.T.contiguous() + b)  # a lone decode: float32
    many = torch.randn(5, 96, generator=g)
    got = lin(many)
    assert got.dtype == torch.float32 and got.shape == (5, 64)
    want = many @ w.T + b
    assert (got - want).abs().max() <= 0.02 * want.abs().max()  # bfloat16 rounding
    assert not torch.equal(got, want)  # it really ran in bfloat16


def test_other_dtypes_use_one_layout():
    lin = Linear.of(torch.randn(8, 4).to(torch.bfloat16))
    assert lin.wt is None
    assert lin(torch.randn(3, 4).to(torch.bfloat16)).dtype == torch.bfloat16
