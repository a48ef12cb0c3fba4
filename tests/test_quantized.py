"""Quantized projections against brute-force references: the de-quantized weight
times the bfloat16-rounded input, and the codes' own definitions."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from corps.engine.model.quantized import (
    GROUP,
    Int4Linear,
    Int8Linear,
    _codes_by_product,
    _unpack_rows,
)

#: the int4 kernel returns bfloat16: a product is within its rounding (2^-8 relative)
#: of the exact product over the same de-quantized weights and bfloat16 inputs
PRODUCT_RTOL = 2**-7


def reference(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """x (M, K) @ W^T in float64 over the bfloat16-rounded inputs the kernels take."""
    return (x.to(torch.bfloat16).double() @ w.double().t()).float()


def close(y: torch.Tensor, ref: torch.Tensor) -> bool:
    if ref.numel() == 0:
        return y.shape == ref.shape
    scale = ref.abs().max().clamp(min=1.0)
    return bool(((y - ref).abs() <= PRODUCT_RTOL * scale).all())


@settings(max_examples=25, deadline=None)
@given(
    n=st.sampled_from([64, 96, 128, 192]),
    groups=st.integers(1, 4),
    rows=st.integers(0, 9),
    seed=st.integers(0, 2**16),
)
def test_int4_product_is_the_dequantized_weights_product(n, groups, rows, seed):
    g = torch.Generator().manual_seed(seed)
    k = groups * GROUP
    q = torch.randint(0, 16, (n, k), generator=g)
    scale = torch.rand(n, groups, generator=g) * 0.1
    zero = torch.randn(n, groups, generator=g) * 0.1
    lin = Int4Linear.of_codes(q, scale, zero)
    # w = (q - 8) s + z with s and z as the kernel holds them (bfloat16)
    s = scale.to(torch.bfloat16).float().repeat_interleave(GROUP, 1)
    z = zero.to(torch.bfloat16).float().repeat_interleave(GROUP, 1)
    w = (q.float() - 8) * s + z
    assert torch.equal(lin.dense(), w)
    x = torch.randn(rows, k, generator=g)
    y = lin(x)
    assert y.shape == (rows, n) and y.dtype == torch.float32
    assert close(y, reference(w, x))


@settings(max_examples=20, deadline=None)
@given(n=st.sampled_from([64, 128]), groups=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_int8_groups_split_into_two_4bit_halves_exactly(n, groups, seed):
    """Q8_0: w = d q for every int8 q, -128 and 127 included."""
    g = torch.Generator().manual_seed(seed)
    k = groups * GROUP
    q = torch.randint(-128, 128, (n, k), generator=g).to(torch.int8)
    q[0, 0], q[0, 1] = -128, 127
    d = torch.rand(n, groups, generator=g) * 0.01
    lin = Int4Linear.from_int8_groups(q, d)
    w = q.float() * d.to(torch.bfloat16).float().repeat_interleave(GROUP, 1)
    assert torch.allclose(lin.dense(), w, rtol=0, atol=0)
    assert lin.in_features == k and lin.split
    x = torch.randn(3, k, generator=g)
    assert close(lin(x), reference(w, x))


def test_rows_are_read_from_the_packed_layout_as_the_kernel_reads_them():
    """The tied embedding's lookup unpacks torch's CPU layout; the product itself
    (x = I) is the oracle of that layout."""
    q = torch.randint(0, 16, (192, 96))
    lin = Int4Linear.of_codes(q, torch.ones(192, 3), torch.zeros(192, 3))
    ids = torch.tensor([0, 1, 31, 32, 63, 64, 100, 191, 5])
    assert torch.equal(_unpack_rows(lin.packed, ids, 192).long(), q[ids])
    assert torch.equal(_codes_by_product(lin.packed, ids, 192, 96).long(), q[ids])


def test_rows_of_a_weight_not_in_whole_tiles_go_through_the_product():
    q = torch.randint(0, 16, (48, 64))
    lin = Int4Linear.of_codes(q, torch.rand(48, 2), torch.rand(48, 2))
    ids = torch.tensor([47, 0, 17])
    assert torch.equal(lin.rows(ids), lin.dense()[ids])


@pytest.mark.parametrize("cls", [Int4Linear, Int8Linear])
def test_quantize_on_load_rounds_to_nearest_within_half_a_step(cls):
    torch.manual_seed(0)
    w = torch.randn(128, 96)
    b = torch.randn(128)
    lin = cls.quantize(w, b)
    err = (lin.dense() - w).abs()
    if cls is Int4Linear:  # half a step of each group's (max - min) / 15, plus bf16
        span = w.view(128, 3, GROUP).amax(-1) - w.view(128, 3, GROUP).amin(-1)
        bound = (span / 15 * 0.5 + span * 2**-7).repeat_interleave(GROUP, 1)
    else:
        bound = (w.abs().amax(1, keepdim=True) / 127) * (0.5 + 2**-7 * 127)
    assert (err <= bound + 1e-6).all()
    x = torch.randn(2, 96)
    assert close(lin(x) - b, reference(lin.dense(), x))
    assert torch.equal(lin.rows(torch.tensor([3, 7])), lin.dense()[[3, 7]])


def test_bad_shapes_are_refused_with_what_is_wrong():
    with pytest.raises(ValueError, match="divisible by 32"):
        Int4Linear.quantize(torch.randn(8, 40))
    with pytest.raises(ValueError, match="one scale and zero per group"):
        Int4Linear.of_codes(torch.zeros(8, 64), torch.ones(8, 1), torch.zeros(8, 1))


def test_weight_bytes_count_codes_and_scales():
    lin = Int4Linear.quantize(torch.randn(128, 64))
    assert lin.weight_bytes == 128 * 64 // 2 + 2 * 128 * 2 * 2  # codes + bf16 (s, z)
    assert Int8Linear.quantize(torch.randn(128, 64)).weight_bytes == 128 * 64 + 128 * 2
