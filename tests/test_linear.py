"""model/linear.py: the projection's layouts, and mixed precision (16-bit weights by row count)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from corps.engine.model import linear, onednn, tuning
from corps.engine.model.linear import FEW_ROWS, Linear, TunedLinear
from corps.engine.model.tuning import KERNELS, ROW_BUCKETS, KernelChoice


def test_float32_keeps_both_layouts_and_both_agree():
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(48, 32, generator=g), torch.randn(48, generator=g)
    lin = Linear.of(w, b)
    assert lin.wt is not None and lin.w.dtype == torch.float32 and lin.few is None
    assert lin.weight_bytes == 48 * 32 * 8
    for rows in (1, 2, 7):
        x = torch.randn(rows, 32, generator=g)
        assert torch.allclose(lin(x), x @ w.T + b, atol=1e-5)


@pytest.mark.parametrize("bf16_units", [True, False], ids=["bf16-cpu", "avx2-cpu"])
def test_mixed_precision_float16_for_few_rows_bfloat16_for_more(bf16_units, monkeypatch):
    """Few rows: float16. More: bfloat16 where the CPU has bfloat16 units, else float32."""
    monkeypatch.setattr(linear, "fast_bfloat16", lambda device: bf16_units)
    g = torch.Generator().manual_seed(1)
    w, b = torch.randn(64, 96, generator=g), torch.randn(64, generator=g)
    lin = Linear.of(w, b, mixed=True)
    many = torch.bfloat16 if bf16_units else torch.float32
    assert lin.wt is None and lin.few.dtype == torch.float16 and lin.w.dtype == many
    assert lin.weight_bytes == 64 * 96 * (4 if bf16_units else 6)  # float32 keeps 8
    assert lin.packed == (bf16_units and onednn._onednn_linear_works(torch.bfloat16))
    assert lin.few_rows == (1 if lin.packed else FEW_ROWS)
    for rows in range(1, 6):
        x = torch.randn(rows, 96, generator=g)
        got = lin(x)
        assert got.dtype == torch.float32 and got.shape == (rows, 64)
        exact = x @ w.T + b
        if rows > lin.few_rows and not bf16_units:
            assert torch.allclose(got, exact, atol=1e-4)
            continue
        half = torch.float16 if rows <= lin.few_rows else torch.bfloat16
        want = F.linear(x.to(half), w.to(half)).float() + b  # the kernel that row count takes
        assert torch.equal(got, want)
        tol = 2e-3 if half == torch.float16 else 2e-2  # float16 keeps 3 more mantissa bits
        assert (got - exact).abs().max() <= tol * exact.abs().max()
        assert not torch.equal(got, exact)  # it really ran in 16 bits


def test_other_dtypes_use_one_layout():
    lin = Linear.of(torch.randn(8, 4).to(torch.bfloat16))
    assert lin.wt is None
    assert lin(torch.randn(3, 4).to(torch.bfloat16)).dtype == torch.bfloat16


def test_mixed_precision_without_a_working_onednn_falls_back_to_plain_bfloat16(monkeypatch):
    monkeypatch.setattr(linear, "fast_bfloat16", lambda device: True)
    monkeypatch.setattr(onednn, "_onednn_linear_works", lambda dtype: False)
    g = torch.Generator().manual_seed(2)
    w = torch.randn(16, 24, generator=g)
    lin = Linear.of(w, mixed=True)
    assert not lin.packed and lin.w.dtype == torch.bfloat16 and not lin.w.is_mkldnn
    x = torch.randn(4, 24, generator=g)
    assert torch.equal(lin(x), F.linear(x.bfloat16(), w.bfloat16()).float())


@pytest.mark.parametrize("kernel", KERNELS)
def test_one_row_weight_is_what_the_one_row_kernel_multiplies_by(kernel):
    """The plain weight a captured step freezes gives the kernel's own product."""
    if kernel not in tuning.available():
        pytest.skip(f"{kernel} is not available in this torch")
    g = torch.Generator().manual_seed(4)
    w, x = torch.randn(40, 24, generator=g), torch.randn(1, 24, generator=g)
    choice = KernelChoice(ROW_BUCKETS, (kernel,) * len(ROW_BUCKETS))
    proj = TunedLinear.of(w, None, choice)
    plain = linear.one_row_weight(proj)
    assert plain.shape == (40, 24)
    want = proj(x)  # (1, 40) float32
    got = F.linear(x.to(plain.dtype), plain).float()
    if kernel in tuning.EXACT:
        torch.testing.assert_close(got, want)  # x @ W^T and F.linear may sum apart
    else:
        assert torch.equal(got, want)


def test_one_row_weight_of_mixed_and_float32_projections():
    w = torch.randn(16, 24, generator=torch.Generator().manual_seed(5))
    assert torch.equal(linear.one_row_weight(Linear.of(w)), w)
    assert torch.equal(linear.one_row_weight(Linear.of(w, mixed=True)), w.half())
