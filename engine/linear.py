"""A projection y = x W^T + b whose weight layout follows the fastest CPU kernel.

Measured on this project's CPU machine (MKL, AVX2, 2 threads, SmolLM2-135M,
every projection of one forward step, best of 5):

    rows      1     2     3     4     8    16    64   512   (ms per step)
    x @ W^T  16.9  25.5  27.7  31.0  42.9  50.7  75.4  472   (W^T stored)
    F.linear 19.4  19.8  21.5  33.6  44.7  47.2  83.0  437
    (W x^T)^T 19.7 49.0  49.6  49.3  48.8  50.7 105    578

One row (a lone decode) goes through the transposed copy; any other count
through `F.linear`, never worse than 10% off the best and 2.3x faster than
`(W x^T)^T` (used before) on the 2-3 row steps of small parallel workflows.
So float32 CPU weights are kept in both layouts (twice the weight memory);
other dtypes and devices use `F.linear` (bfloat16 gemm on AVX2 is 20x slower
transposed).

Mixed precision (`Engine.open(dtype="mixed")`): on CPUs with bfloat16 matrix units
(AMX, AVX512-BF16) a multi-row bfloat16 gemm costs what one row does, while float32
multi-row products cost 2-3x one row. Measured on such a CPU (2 threads, all the
projections of one SmolLM2-135M step, ms):

    rows              1     2     4     8    16    64
    x @ W^T (fp32)  17.1  26.1  33.0  47.3  53.6  89.4
    F.linear bf16   20.6  22.1  21.7  22.5  24.2  30.8

So "mixed" keeps the float32 W^T for single rows (a lone decode stays exact
float32) and a bfloat16 W for every other row count, cast in and out of it; the
rest of the model (norms, attention, the KV store) stays float32. Weight memory:
1.5x float32 instead of 2x.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass(frozen=True)
class Linear:
    w: Tensor  # (N, K), for multi-row products; bfloat16 in mixed precision
    b: Tensor | None = None  # (N,), in the model's dtype
    wt: Tensor | None = None  # (K, N), contiguous; single rows, only where it is faster

    @classmethod
    def of(cls, w: Tensor, b: Tensor | None = None, multi_row: torch.dtype | None = None) -> Linear:
        """`multi_row`: keep W in this dtype for products of more than one row."""
        dual = w.device.type == "cpu" and w.dtype == torch.float32
        wt = w.t().contiguous() if dual else None
        if multi_row is not None and multi_row != w.dtype:
            w = w.to(multi_row)
        return cls(w, b, wt)

    def __call__(self, x: Tensor) -> Tensor:
        """x (M, K) -> (M, N), contiguous, in x's dtype."""
        if self.wt is not None and x.shape[0] == 1:
            y = x @ self.wt  # (1, N)
        elif self.w.dtype != x.dtype:  # mixed precision: a bfloat16 gemm, cast in and out
            y = F.linear(x.to(self.w.dtype), self.w).to(x.dtype)  # (M, N)
        else:
            return F.linear(x, self.w, self.b)  # (M, N)
        return y if self.b is None else y + self.b
