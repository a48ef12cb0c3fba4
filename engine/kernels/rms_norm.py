"""rms_norm_fused: RMSNorm over the last dim in one launch, with transformers' rounding.

Contract: for x (..., E) in a 16-bit dtype and weight (E,) in the same dtype,

    out = weight * (xf * rsqrt(mean(xf ** 2) + eps)).to(x.dtype),   xf = x.float()

as `corps.engine.model.runner.rms_norm` (and transformers' LlamaRMSNorm) computes
it: in float32, rounded to x's dtype, then the product with the weight rounded
again. Written out in torch that is eight kernels (cast, square, mean, add, rsqrt,
product, cast, product); a decode step on a GPU runs two per layer, and there a
step's time is mostly its launches (an H200 ran a 1B model's decode at 2.4 ms a
token for ~0.55 ms of weights). Here it is one. The sums run in another order
than torch's, so a value may differ from the reference by one unit in the last
place of x's dtype (the tests bound it). Float32 inputs keep the torch path
(exact against transformers).
"""

from __future__ import annotations

from functools import cache

import torch
from torch import Tensor


@cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def rms_norm_kernel(x, w, out, s_x, s_o, n, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        d = tl.arange(0, BLOCK)
        keep = d < n
        xf = tl.load(x + row * s_x + d, mask=keep, other=0.0).to(tl.float32)
        inv = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / n + eps)
        normed = (xf * inv).to(out.dtype.element_ty).to(tl.float32)  # HF's first rounding
        wf = tl.load(w + d, mask=keep, other=0.0).to(tl.float32)
        tl.store(out + row * s_o + d, (wf * normed).to(out.dtype.element_ty), mask=keep)

    return rms_norm_kernel


def takes(x: Tensor, weight: Tensor) -> bool:
    """Whether `rms_norm_fused` takes these: 16-bit x, and a weight of its dtype."""
    return x.dtype in (torch.bfloat16, torch.float16) and weight.dtype == x.dtype


def rms_norm_fused(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """The Triton kernel (contract above). x (..., E) in bfloat16 or float16."""
    import triton

    if not takes(x, weight):
        raise ValueError(f"rms_norm_fused takes 16-bit x and weight, got {x.dtype}")
    n = x.shape[-1]
    rows = x.reshape(-1, n)  # (R, E): a view when rows are evenly spaced, else a copy
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    if rows.shape[0]:
        _kernel()[(rows.shape[0],)](
            rows, weight, out, rows.stride(0), out.stride(0), n, eps,
            BLOCK=triton.next_power_of_2(n),
        )  # fmt: skip
    return out.view(x.shape)
