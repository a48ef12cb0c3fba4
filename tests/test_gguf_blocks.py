"""Every GGUF block type read as codes and group factors, against the `gguf` package's
own de-quantization of the same bytes (the brute-force oracle): random blocks, random
group scales, the kernel's product over them against a dense product."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from corps.engine.model.gguf_blocks import SIZES, decode
from corps.engine.model.quantized import Int4Linear

#: types whose block starts with d and then a second float16 (m or dmin)
TWO_FACTORS = ("Q4_1", "Q5_1", "Q4_K", "Q5_K")


def random_blocks(kind: str, n: int, k: int, seed: int) -> np.ndarray:
    """Random bytes as (N, K) weights of `kind`, each block's float16 factors set to
    finite values of either sign over three decades (random bytes may be NaN)."""
    per, size = SIZES[kind]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (n, k // per, size), dtype=np.uint8)
    for at in (0, 2) if kind in TWO_FACTORS else (0,):
        f = rng.uniform(1e-3, 1, (n, k // per)) * rng.choice([-1, 1], (n, k // per))
        raw[..., at : at + 2] = f.astype(np.float16)[..., None].view(np.uint8)
    return raw


def linear(kind: str, raw: np.ndarray, n: int, k: int) -> Int4Linear:
    b = decode(kind, raw.reshape(-1), n, k)
    if b.kind == "int4":
        return Int4Linear.of_codes(b.codes, b.scale, b.zero)
    return Int4Linear.from_int8_groups(b.codes, b.scale, plus=b.zero)


def oracle(kind: str, raw: np.ndarray, n: int, k: int) -> torch.Tensor:
    """The file's own values of those bytes, as llama.cpp's package de-quantizes them."""
    w = gguf.quants.dequantize(raw.reshape(n, -1), gguf.GGMLQuantizationType[kind])
    return torch.from_numpy(np.asarray(w, dtype=np.float32)).reshape(n, k)


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(sorted(SIZES)), st.integers(0, 2**32 - 1), st.integers(1, 3))
def test_codes_and_factors_are_the_files_own_values(kind, seed, blocks):
    """Each weight is the file's value up to the kernel's bfloat16 rounding of its
    group's scale and zero: within 2^-7 of the tensor's largest magnitude."""
    n, k = 64, 256 * blocks
    raw = random_blocks(kind, n, k, seed)
    want = oracle(kind, raw, n, k)
    got = linear(kind, raw, n, k).dense()
    assert torch.allclose(got, want, rtol=0, atol=2**-7 * want.abs().max().item())


@pytest.mark.parametrize("kind", sorted(SIZES))
def test_the_kernels_product_is_the_dense_product(kind):
    """x W^T through the int4 kernel against float32 over the file's values: within
    1% of the output's largest magnitude (activations rounded to bfloat16 too)."""
    n, k = 128, 512
    raw = random_blocks(kind, n, k, seed=7)
    x = torch.randn(5, k)
    want = x @ oracle(kind, raw, n, k).t()
    got = linear(kind, raw, n, k)(x)
    assert (got - want).abs().max() <= 0.01 * want.abs().max()


def test_wide_codes_are_split_and_four_bit_codes_are_not():
    """5- and 8-bit codes become hi and lo 4-bit halves (twice the groups), 4-bit ones not."""
    for kind in SIZES:
        raw = random_blocks(kind, 64, 256, seed=1)
        lin = linear(kind, raw, 64, 256)
        assert lin.split == (kind[1] in "58")
        assert lin.in_features == 256
