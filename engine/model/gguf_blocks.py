"""GGUF block types read as codes and per-group factors, for the int4 kernel as they are.

Every block type here has one scale per group of 32 inputs (the kernel's group), so
its weights are, per group g and input k, w = d_g s_k + c_g with an integer code s:

    type   bytes / weights   code s               d              c
    Q4_0   18 / 32           q - 8, q in 0..15     d              0
    Q4_1   20 / 32           q, 0..15              d              m
    Q4_K  144 / 256          q, 0..15              d sc_j         -dmin m_j
    Q8_0   34 / 32           q, -128..127          d              0
    Q5_0   22 / 32           q - 16, q in 0..31    d              0
    Q5_1   24 / 32           q, 0..31              d              m
    Q5_K  176 / 256          q, 0..31              d sc_j         -dmin m_j

(K-quants: a block of 256 is 8 groups of 32, group j with 6-bit sc_j and m_j unpacked
by the `gguf` package's own `Q4_K.get_scale_min`.) 4-bit codes become `Int4Linear`
groups directly ("int4": w = (q - 8) scale + zero with q in 0..15, scale d and zero
c + 8 d; Q4_0's q is its file code, zero 0); wider codes are split into two 4-bit
halves, s = 16 hi + lo
("split", `Int4Linear.from_int8_groups`): the same codes, exact but for the kernel's
bfloat16 rounding of each group's d and c. Types whose groups are 16 wide (Q6_K,
Q2_K, Q3_K) or that are not codes at all (F16, BF16, the IQ types) have no entry: the
caller keeps their de-quantized values dense.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

GROUP = 32  # weights per group of one scale: the kernel's and every type's here

#: block type -> (weights per block, bytes per block), as the `gguf` package states them
SIZES = {
    "Q4_0": (32, 18),
    "Q4_1": (32, 20),
    "Q4_K": (256, 144),
    "Q8_0": (32, 34),
    "Q5_0": (32, 22),
    "Q5_1": (32, 24),
    "Q5_K": (256, 176),
}


@dataclass(frozen=True)
class Blocks:
    """One tensor's weights as codes and group factors, rows as stored in the file."""

    kind: str  # "int4": w = (q - 8) scale + zero; "split": w = scale s + zero
    codes: Tensor  # (N, K): uint8 0..15 ("int4") or int16 -128..127 ("split")
    scale: Tensor  # (N, K / 32) float32
    zero: Tensor  # (N, K / 32) float32


def decode(kind: str, raw: np.ndarray, n: int, k: int) -> Blocks:
    """The blocks of an (N, K) tensor of block type `kind` from its raw bytes
    (N * K / weights-per-block * bytes-per-block of them; the caller checks the size)."""
    per, size = SIZES[kind]
    b = raw.reshape(n, k // per, size)  # (N, B, bytes)
    if kind.endswith("_K"):
        s, d, c = _k_quant(b, kind)
    else:
        s, d, c = _legacy(b, kind)
    s, d, c = (torch.from_numpy(np.ascontiguousarray(x)) for x in (s, d, c))
    s, d, c = s.reshape(n, k), d.reshape(n, k // GROUP).float(), c.reshape(n, k // GROUP).float()
    if kind.startswith("Q4"):  # codes 0..15: one 4-bit group each
        centred = kind == "Q4_0"
        codes = (s + 8 if centred else s).to(torch.uint8)
        return Blocks("int4", codes, d, c if centred else c + 8 * d)
    return Blocks("split", s.to(torch.int16), d, c)


def _f16(b: np.ndarray, at: int) -> np.ndarray:
    """The float16 at byte `at` of every block, as float32 (N, B)."""
    return np.ascontiguousarray(b[..., at : at + 2]).view(np.float16)[..., 0].astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """Bytes (..., 16 j) as 4-bit codes: the low nibbles, then the high ones (..., 32 j)."""
    return np.concatenate([qs & 15, qs >> 4], axis=-1)


def _legacy(b: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Blocks of 32 with one d (and Q4_1 / Q5_1's m): codes (N, B, 32), d and c (N, B)."""
    d = _f16(b, 0)
    m = _f16(b, 2) if kind in ("Q4_1", "Q5_1") else np.zeros_like(d)
    if kind == "Q8_0":
        return np.ascontiguousarray(b[..., 2:]).view(np.int8).astype(np.int16), d, m
    at = 4 if kind in ("Q4_1", "Q5_1") else 2
    if kind.startswith("Q4"):
        q = _nibbles(b[..., at:]).astype(np.int16)
        return (q - 8 if kind == "Q4_0" else q), d, m
    hi = np.unpackbits(b[..., at : at + 4], axis=-1, bitorder="little")  # bit j: weight j
    q = (_nibbles(b[..., at + 4 :]) | (hi << 4)).astype(np.int16)  # (N, B, 32) 0..31
    return (q - 16 if kind == "Q5_0" else q), d, m


def _k_quant(b: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Super-blocks of 256 (8 groups of 32): codes (N, B, 256), d and c (N, B, 8)."""
    import gguf

    n, nb, _ = b.shape
    d, dmin = _f16(b, 0)[..., None], _f16(b, 2)[..., None]  # (N, B, 1)
    sc, m = gguf.quants.Q4_K.get_scale_min(np.ascontiguousarray(b[..., 4:16]).reshape(-1, 12))
    sc, m = sc.reshape(n, nb, 8).astype(np.float32), m.reshape(n, nb, 8).astype(np.float32)
    qs = b[..., -128:].reshape(n, nb, 4, 32)  # 4 chunks: groups 2i (low), 2i + 1 (high)
    q = np.stack([qs & 15, qs >> 4], axis=3).reshape(n, nb, 8, 32)
    if kind == "Q5_K":  # bit j of byte i of qh: the fifth bit of weight i of group j
        qh = b[..., 16:48][:, :, None, :] >> np.arange(8, dtype=np.uint8)[:, None]
        q = q | ((qh & 1) << 4)
    return q.astype(np.int16).reshape(n, nb, 256), d * sc, -dmin * m
