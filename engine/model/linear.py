"""A projection y = x W^T + b whose weight layout follows the fastest CPU kernel.

Engines on a CPU in `auto` or `float32` build `TunedLinear`s from kernels timed on
the machine (`corps.engine.model.tuning`); `Linear` holds the fixed rules below, for
`mixed`, GPUs, and weights built without a measured choice.

float32 (exact against transformers). Measured on an AVX2
CPU (MKL, 2 threads, SmolLM2-135M, every projection of one forward step, best of 5):

    rows      1     2     3     4     8    16    64   512   (ms per step)
    x @ W^T  16.9  25.5  27.7  31.0  42.9  50.7  75.4  472   (W^T stored)
    F.linear 19.4  19.8  21.5  33.6  44.7  47.2  83.0  437
    (W x^T)^T 19.7 49.0  49.6  49.3  48.8  50.7 105    578

One row (a lone decode) goes through the transposed copy; any other count
through `F.linear`, never worse than 10% off the best and 2.3x faster than
`(W x^T)^T` on the 2-3 row steps of small parallel workflows. So float32 CPU
weights are kept in both layouts (twice the weight memory); bfloat16 and float16
use `F.linear` alone (a bfloat16 gemm on AVX2 is 20x slower transposed).

Mixed precision (`Engine.open(dtype="mixed")`): 16-bit weights, float32 everything
else (activations, norms, attention, the KV store). Each product picks its kernel by
row count. Measured on an AVX-512 / AVX512-BF16 CPU without AMX (2 threads, all
projections of one step, ms, casts in and out included):

    rows                 1     2     3     4     8    16
    x @ W^T (float32)  32.4  48.2   -   70.8    -   79.1
    F.linear float16   11.1  20.9  22.6  29.1  82.5  123
    F.linear bfloat16  23.2  22.4  20.1  21.5  34.4  31.3

A float16 product of one row reads half the bytes of float32 and accumulates in
float32 (torch's reduced-precision gemv), so a lone decode runs at nearly 3x
float32; from two rows on (prepacked, below; three if not), the bfloat16 gemm is
the fastest. So "mixed" keeps W twice, in float16 (few rows) and bfloat16 (more):
4 bytes per weight, half of float32's two layouts. Float16 keeps 3 more mantissa
bits than bfloat16; its range (65504) is far above this model family's activations.
On a CPU without bfloat16 units (AVX2 only: there a bfloat16 gemm is several
times slower than float32) the multi-row copy stays float32 (6 bytes per weight).

The bfloat16 copy is held in oneDNN's blocked layout where oneDNN can (the
layout torch's own CPU compiler uses for frozen linears), so no step reorders
the weight: same results bit for bit as `F.linear`, and faster (same CPU, ms):

    rows                        1     3     4    16    64   512
    F.linear bfloat16         18.1  21.0  20.7  28.4  60.2   395
    oneDNN, prepacked weight  12.8  13.3  11.5  18.8  49.1   351
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from corps.engine.model.onednn import (
    onednn_pack,
    packed_product,
    unpack_onednn,
)
from corps.engine.model.tuning import PACKED, KernelChoice, layouts, product

#: In mixed precision, products of at most this many rows use the float16 weights
#: (one row only where the bfloat16 weights are prepacked: see `Linear.few_rows`).
FEW_ROWS = 2


@dataclass(frozen=True)
class Linear:
    w: Tensor  # (N, K), for multi-row products; bfloat16 in mixed precision
    b: Tensor | None = None  # (N,), in the model's dtype
    wt: Tensor | None = None  # (K, N), contiguous; float32 single rows, only where faster
    few: Tensor | None = None  # (N, K) float16, for products of <= few_rows rows (mixed)
    packed: bool = False  # w is in oneDNN's blocked layout (bfloat16, mixed)

    @classmethod
    def of(cls, w: Tensor, b: Tensor | None = None, *, mixed: bool = False) -> Linear:
        """`mixed`: keep W in float16 for few rows, and in bfloat16 for more where the
        device has fast bfloat16 gemms (else in w's dtype), instead of w's layouts."""
        if mixed:
            few = w.to(torch.float16)
            if not fast_bfloat16(w.device):
                return cls(w, b, None, few)
            many = w.to(torch.bfloat16)
            packed = onednn_pack(many)
            return cls(many if packed is None else packed, b, None, few, packed is not None)
        dual = w.device.type == "cpu" and w.dtype == torch.float32
        return cls(w, b, w.t().contiguous() if dual else None)

    @property
    def few_rows(self) -> int:
        """Row counts up to this run the float16 gemv (mixed). Prepacked bfloat16 is
        faster from two rows on (15.4-16.6 ms against 20.3-23.1 for float16, all the
        projections of a step here); plain bfloat16 only from three."""
        return 1 if self.packed else FEW_ROWS

    @property
    def in_features(self) -> int:
        return self.w.shape[1]

    def holds(self, t: Tensor) -> bool:
        """Whether `t` is one of the weight layouts kept here (a tied embedding)."""
        return t is self.w or t is self.few

    @property
    def weight_bytes(self) -> int:
        """Bytes held by this projection's weight layouts (not its bias)."""
        return sum(
            t.numel() * t.element_size() for t in (self.w, self.wt, self.few) if t is not None
        )

    def __call__(self, x: Tensor) -> Tensor:
        """x (M, K) -> (M, N), contiguous, in x's dtype."""
        rows = x.shape[0]
        if self.wt is not None and rows == 1:
            y = x @ self.wt  # (1, N)
        elif self.few is not None and rows <= self.few_rows:  # mixed: float16 gemv
            y = F.linear(x.to(self.few.dtype), self.few).to(x.dtype)  # (M, N)
        elif self.packed:  # mixed: oneDNN's bfloat16 gemm on the prepacked W
            y = packed_product(x.to(torch.bfloat16), self.w).to(x.dtype)
        elif self.w.dtype != x.dtype:  # mixed: a bfloat16 gemm, cast in and out
            y = F.linear(x.to(self.w.dtype), self.w).to(x.dtype)  # (M, N)
        else:
            return F.linear(x, self.w, self.b)  # (M, N)
        return y if self.b is None else y + self.b


@dataclass(frozen=True)
class TunedLinear:
    """A projection whose kernel follows a measured `KernelChoice` for the step's row
    count (`dtype="auto"`, `corps.engine.model.tuning`): it holds the weight layouts of the
    kernels chosen, and nothing else."""

    layouts: dict[str, Tensor]  # kernel -> its layout of W
    by_rows: tuple[str, ...]  # the kernel for 1 .. len rows (index rows - 1)
    last: str  # the kernel for more rows
    in_features: int  # K
    b: Tensor | None = None  # (N,) float32

    @classmethod
    def of(cls, w: Tensor, b: Tensor | None, choice: KernelChoice) -> TunedLinear:
        """W (N, K) float32 in the layouts of the kernels `choice` uses."""
        top = choice.buckets[-1]
        by_rows = tuple(choice.kernel_for(r) for r in range(1, top + 1))
        return cls(layouts(w, choice.used), by_rows, choice.kernels[-1], w.shape[1], b)

    def holds(self, t: Tensor) -> bool:
        """Whether `t` is one of the weight layouts kept here (a tied embedding)."""
        return any(t is x for x in self.layouts.values())

    @property
    def weight_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.layouts.values())

    def kernel_for(self, rows: int) -> str:
        return self.by_rows[rows - 1] if rows <= len(self.by_rows) else self.last

    def __call__(self, x: Tensor) -> Tensor:
        """x (M, K) float32 -> (M, N) float32."""
        k = self.kernel_for(x.shape[0])
        y = product(k, x, self.layouts[k])
        return y if self.b is None else y + self.b


def fast_bfloat16(device: torch.device) -> bool:
    """Whether bfloat16 gemms beat float32 ones here: GPUs, and CPUs with AVX512-BF16
    or AMX (torch.cpu's probes; False if this torch lacks them)."""
    if device.type != "cpu":
        return True
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, p, lambda: False)() for p in probes)


def one_row_weight(proj: Linear | TunedLinear) -> Tensor:
    """The plain (N, K) weight of the kernel `proj` uses for one row, in that
    kernel's dtype: a view of a layout kept, or an unpacked copy of a blocked one."""
    if isinstance(proj, TunedLinear):
        kernel = proj.kernel_for(1)
        w = proj.layouts[kernel]
        if kernel == "float32-t":
            return w.t()  # (N, K) view of W^T
        return unpack_onednn(w, proj.in_features) if kernel in PACKED else w
    return proj.w if proj.few is None else proj.few  # mixed: the float16 gemv, 1 row
