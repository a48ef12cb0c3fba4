"""Projections whose weights stay quantized: 4 bits per group of 32, or 8 bits per channel.

`Int4Linear` keeps W (N, K) as 4-bit codes q in 0..15 with, per output row and group
of 32 inputs, a scale s and a zero z: w = (q - 8) s + z. That is GGUF's Q4_0
(z = 0) and Q4_1 (w = d q + m, so s = d, z = m + 8 d) as they are, and a
round-to-nearest quantization of any dense weight (`Int4Linear.quantize`). Its
product is torch's packed int4 kernel (`_weight_int4pack_mm_for_cpu` on a CPU,
`_weight_int4pack_mm` on CUDA), which takes bfloat16 activations and bfloat16
scales and zeros: the file's float16 d and m lose 3 mantissa bits there (a
relative error of at most 2^-9 on each group's scale), and the activations are
rounded to bfloat16 on the way in. Measured on a 2-core AMD EPYC (Zen 4,
AVX512-BF16, no AMX; one product, microseconds, mean of 200 after 20 warm-ups,
nothing else running):

    weight (K x N)          rows   int4 (bfloat16)   bfloat16, oneDNN prepacked
    576 x 960 (qkv)           1          22                  42
    576 x 3072 (gate, up)     1          54                  48
    1536 x 576 (down)         1          30                  34
    576 x 3072               16         372                 157
    576 x 3072               64       1,436                 559
    576 x 49152 (a head)      1         778    (int8 per channel 1,566; float16 gemv 1,674)
    1152 x 49152 (Q8_0 split) 1       1,652

One row reads a quarter of bfloat16's bytes but the kernel's cost grows with the
rows about as fast as a row's own (no reuse of the de-quantized tile across rows):
from a few rows on, bfloat16 is faster (docs/benchmarks.md, "One chat stream").
In float32 or float16 the int4 kernel is 20-60x slower on this CPU (no vector code).

GGUF's Q8_0 (w = d q, q an int8, one d per group of 32) has no group-wise int8
kernel in torch. It splits exactly into two 4-bit codes, q = 16 hi + lo with hi in
-8..7 and lo in 0..15, so `Int4Linear.from_int8_groups` keeps it as 4-bit groups
over K twice: a group of hi codes (scale 16 d, zero 0) and one of lo codes (scale
d, zero 8 d), the activations fed once to each (`split`). Same bytes as int8,
two 4-bit products' time, and nothing rounded but d.

`Int8Linear` is per-channel symmetric int8 (`_weight_int8pack_mm`, a CPU kernel):
the format of quantize-on-load `weights="int8"`.

Both serve embedding lookups from the same codes (`rows`), so a tied embedding
costs no second copy.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor

GROUP = 32  # inputs per 4-bit group: GGUF's block of 32, torch's smallest group
#: output rows per block of torch's CPU int4 layout, by CPU: 64 with AVX-512, 32 with
#: AVX2 (`cpu_tile` finds which this CPU packs)
TILES = (64, 32)


@dataclass(frozen=True)
class Int4Linear:
    """y = x W^T + b with W as 4-bit codes per group of 32 (see the module doc)."""

    packed: Tensor  # torch's packed int4 layout of the (N, K') codes, K' = K (2 K if split)
    scales_zeros: Tensor  # (K' / 32, N, 2) bfloat16: each group's scale and zero
    out_features: int  # N
    in_features: int  # K
    split: bool = False  # Q8_0 kept as hi and lo codes: every group of x is read twice
    b: Tensor | None = None  # (N,) in the model's dtype

    @classmethod
    def of_codes(
        cls, q: Tensor, scale: Tensor, zero: Tensor, b: Tensor | None = None, *, split=False
    ) -> Int4Linear:
        """From codes q (N, K') in 0..15 and a scale and zero per group (N, K' / 32):
        w = (q - 8) scale + zero."""
        n, k2 = q.shape
        if k2 % GROUP or scale.shape != (n, k2 // GROUP) or zero.shape != scale.shape:
            raise ValueError(f"4-bit codes {tuple(q.shape)} need one scale and zero per group")
        packed = _pack(q.to(torch.uint8))
        sz = torch.stack([scale.t(), zero.t()], dim=-1).to(torch.bfloat16).contiguous()
        return cls(packed, sz, n, k2 // 2 if split else k2, split, b)

    @classmethod
    def quantize(cls, w: Tensor, b: Tensor | None = None) -> Int4Linear:
        """Round-to-nearest per group of 32 between each group's min and max (Q4_1's
        rule) of a dense W (N, K), K a multiple of 32."""
        n, k = w.shape
        if k % GROUP:
            raise ValueError(f"int4 needs in_features divisible by {GROUP}, got {k}")
        g = w.float().view(n, k // GROUP, GROUP)
        lo, hi = g.amin(-1), g.amax(-1)  # (N, G)
        scale = (hi - lo) / 15
        inv = torch.where(scale > 0, 1 / scale, torch.zeros_like(scale))
        q = ((g - lo[..., None]) * inv[..., None]).round().clamp(0, 15).view(n, k)
        return cls.of_codes(q, scale, lo + 8 * scale, b)

    @classmethod
    def from_int8_groups(
        cls, q: Tensor, d: Tensor, b: Tensor | None = None, *, plus: Tensor | None = None
    ) -> Int4Linear:
        """Exactly w = d q (+ plus) for integer codes q (N, K) in -128..127 and one d
        (and one plus) per group of 32 (N, K / 32): GGUF's Q8_0, and the 5-bit types
        (`gguf_blocks`), as hi and lo 4-bit groups side by side (`split`)."""
        n, k = q.shape
        q = q.to(torch.int16).view(n, k // GROUP, 1, GROUP)
        hi, lo = q.div(16, rounding_mode="floor"), q.remainder(16)  # q = 16 hi + lo
        codes = torch.cat([hi + 8, lo], dim=2).view(n, 2 * k)  # (N, 2K): hi group, lo group
        d = d.float()[..., None]  # (N, G, 1)
        scale = torch.cat([16 * d, d], dim=2).view(n, 2 * k // GROUP)
        lo_zero = 8 * d if plus is None else 8 * d + plus.float()[..., None]
        zero = torch.cat([torch.zeros_like(d), lo_zero], dim=2).view(n, 2 * k // GROUP)
        return cls.of_codes(codes, scale, zero, b, split=True)

    @property
    def weight_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.packed, self.scales_zeros))

    def holds(self, t: object) -> bool:
        return t is self

    def __call__(self, x: Tensor) -> Tensor:
        """x (M, K) -> (M, N) in x's dtype."""
        return int4_product(x, self.packed, self.scales_zeros, self.split, self.b)

    def rows(self, ids: Tensor) -> Tensor:
        """Rows `ids` (T,) of W, dequantized (T, K) float32: a tied embedding's lookup."""
        q = _unpack_rows(self.packed, ids, self.out_features).float()  # (T, K')
        sz = self.scales_zeros[:, ids].float()  # (K' / 32, T, 2)
        t = q.shape[0]
        w = (q.view(t, -1, GROUP) - 8) * sz[..., 0].t()[..., None] + sz[..., 1].t()[..., None]
        if self.split:  # hi and lo groups add up to d q
            return w.view(t, -1, 2, GROUP).sum(2).view(t, self.in_features)
        return w.view(t, self.in_features)

    def dense(self) -> Tensor:
        """W (N, K) float32 as the kernel sees it: the reference of the tests."""
        return self.rows(torch.arange(self.out_features, device=self.packed.device))


@dataclass(frozen=True)
class Int8Linear:
    """y = x W^T + b with W as int8 codes and one scale per output row: w = q s."""

    q: Tensor  # (N, K) int8
    scale: Tensor  # (N,) bfloat16 (the kernel's dtype)
    b: Tensor | None = None

    @classmethod
    def quantize(cls, w: Tensor, b: Tensor | None = None) -> Int8Linear:
        """Round-to-nearest, symmetric, per output row of a dense W (N, K)."""
        wf = w.float()
        scale = wf.abs().amax(1).clamp(min=1e-12) / 127  # (N,)
        q = (wf / scale[:, None]).round().clamp(-127, 127).to(torch.int8)
        return cls(q.contiguous(), scale.to(torch.bfloat16), b)

    @property
    def in_features(self) -> int:
        return self.q.shape[1]

    @property
    def out_features(self) -> int:
        return self.q.shape[0]

    @property
    def weight_bytes(self) -> int:
        return self.q.numel() + self.scale.numel() * self.scale.element_size()

    def holds(self, t: object) -> bool:
        return t is self

    def __call__(self, x: Tensor) -> Tensor:
        """x (M, K) -> (M, N) in x's dtype (a CPU kernel: on CUDA, de-quantized rows)."""
        return int8_product(x, self.q, self.scale, self.b)

    def rows(self, ids: Tensor) -> Tensor:
        """Rows `ids` (T,) of W (T, K) float32."""
        return self.q[ids].float() * self.scale[ids].float()[:, None]

    def dense(self) -> Tensor:
        return self.q.float() * self.scale.float()[:, None]


Quantized = Int4Linear | Int8Linear


def int4_product(
    x: Tensor, packed: Tensor, scales_zeros: Tensor, split: bool, b: Tensor | None = None
) -> Tensor:
    """x (M, K) times `Int4Linear`'s codes -> (M, N) in x's dtype. A function of its
    tensors, so that a module holding them as buffers (`decode_module`) calls it too."""
    xb = x.to(torch.bfloat16)
    if split:  # (M, G, 2, 32): each group once for its hi codes, once for its lo
        m, g = x.shape[0], x.shape[1] // GROUP
        xb = xb.view(m, g, 1, GROUP).expand(m, g, 2, GROUP).reshape(m, 2 * g * GROUP)
    if xb.is_cuda:
        y = torch.ops.aten._weight_int4pack_mm(xb, packed, GROUP, scales_zeros)
    else:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(xb, packed, GROUP, scales_zeros)
    y = y.to(x.dtype)  # (M, N)
    return y if b is None else y + b


def int8_product(x: Tensor, q: Tensor, scale: Tensor, b: Tensor | None = None) -> Tensor:
    """x (M, K) times `Int8Linear`'s codes -> (M, N) in x's dtype."""
    xb = x.to(torch.bfloat16)
    if xb.is_cuda:
        y = xb @ (q.to(torch.bfloat16) * scale[:, None]).t()
    else:
        y = torch.ops.aten._weight_int8pack_mm(xb, q, scale)
    y = y.to(x.dtype)
    return y if b is None else y + b


def _pack(q: Tensor) -> Tensor:
    """Codes (N, K) uint8 in 0..15 -> torch's packed int4 layout for q's device."""
    if q.is_cuda:  # pairs of codes per byte, high nibble first, then the CUDA tiling
        pairs = (q[:, ::2] << 4 | q[:, 1::2]).contiguous()  # (N, K / 2)
        return torch.ops.aten._convert_weight_to_int4pack(pairs, 8)
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)


def _unpack_rows(packed: Tensor, ids: Tensor, n: int) -> Tensor:
    """Codes (T, K) uint8 of rows `ids` of a packed int4 weight of `n` rows."""
    if packed.is_cuda:
        raise NotImplementedError("row lookups of CUDA int4 weights are not supported")
    tile = cpu_tile()
    if tile is None or n % tile:  # a layout we do not read: unpack through the kernel
        return _codes_by_product(packed, ids, n, packed.shape[-1] * 2)
    return _read_tiles(packed, ids, n, tile)


def _read_tiles(packed: Tensor, ids: Tensor, n: int, tile: int) -> Tensor:
    """torch's CPU layout, per block of `tile` rows: byte [k, j] holds row j's code k
    in its low nibble and row j + tile / 2's in its high one (`test_quantized` checks
    it against the product)."""
    k = packed.shape[1] * 2
    blocks = packed.view(n // tile, k, tile // 2)
    j = ids % tile
    byte = blocks[ids // tile, :, j % (tile // 2)]  # (T, K)
    return torch.where((j >= tile // 2)[:, None], byte >> 4, byte & 15)


@functools.cache
def cpu_tile() -> int | None:
    """The rows per block of the layout torch's CPU int4 packing uses on this CPU (it
    follows the instructions the kernel was built for): found by packing random codes
    and reading them back; None if no layout of `TILES` reads them."""
    g = torch.Generator().manual_seed(0)
    n, k = 2 * max(TILES), 2 * GROUP
    q = torch.randint(0, 16, (n, k), generator=g)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
    ids = torch.arange(n)
    for tile in TILES:
        if torch.equal(_read_tiles(packed, ids, n, tile).long(), q):
            return tile
    return None


def _codes_by_product(packed: Tensor, ids: Tensor, n: int, k: int) -> Tensor:
    """Codes of rows `ids` read back through the CPU product itself (any layout): with
    scale 1 and zero 8, x = I gives q; slow, only for layouts `_unpack_rows` cannot read."""
    sz = torch.zeros(k // GROUP, n, 2, dtype=torch.bfloat16, device=packed.device)
    sz[..., 0], sz[..., 1] = 1, 8
    eye = torch.eye(k, dtype=torch.bfloat16, device=packed.device)
    w = torch.ops.aten._weight_int4pack_mm_for_cpu(eye, packed, GROUP, sz)  # (K, N)
    return w[:, ids].t().round().to(torch.uint8)
