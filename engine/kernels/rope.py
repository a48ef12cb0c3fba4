"""rope_fused: rotate a step's queries and keys by their positions in one launch, with
transformers' rounding.

Contract: for x (T, H, D) in a 16-bit dtype (any strides but a contiguous head dim)
and cos, sin (T, 1, D) (or (T, D)) in the same dtype, with half = D / 2,

    out = x * cos + rotate_half(x) * sin,   rotate_half(x) = cat(-x[..., half:], x[..., :half])

each product and the sum rounded to the dtype, as `corps.cache.rope.apply_rope`
(and transformers) compute it op by op: out[..., :half] = x1 c1 - x2 s1 and
out[..., half:] = x2 c2 + x1 s2. Written out in torch that is five kernels (two
products, the negation, the concatenation, the sum) a layer; here it is one
(a GPU's decode step is bound by its launches: `corps.engine.kernels.rms_norm`).
Float32 keeps the torch path (exact against transformers; a kernel could fuse a
product into the sum).
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
    def rope_kernel(x, cos, sin, out, s_t, s_h, s_c, s_ot, s_oh, HALF: tl.constexpr):
        t = tl.program_id(0)
        h = tl.program_id(1)
        d = tl.arange(0, HALF)
        src = x + t * s_t + h * s_h
        dt = out.dtype.element_ty
        x1 = tl.load(src + d).to(tl.float32)
        x2 = tl.load(src + HALF + d).to(tl.float32)
        c1 = tl.load(cos + t * s_c + d).to(tl.float32)
        c2 = tl.load(cos + t * s_c + HALF + d).to(tl.float32)
        s1 = tl.load(sin + t * s_c + d).to(tl.float32)
        s2 = tl.load(sin + t * s_c + HALF + d).to(tl.float32)
        # each product rounded before the sum, as torch's ops round them
        lo = (x1 * c1).to(dt).to(tl.float32) + (-x2 * s1).to(dt).to(tl.float32)
        hi = (x2 * c2).to(dt).to(tl.float32) + (x1 * s2).to(dt).to(tl.float32)
        dst = out + t * s_ot + h * s_oh
        tl.store(dst + d, lo.to(dt))
        tl.store(dst + HALF + d, hi.to(dt))

    return rope_kernel


def takes(x: Tensor, cos: Tensor) -> bool:
    """Whether `rope_fused` takes these: 16-bit x and tables of its dtype, and a head
    dim twice a power of two (the kernel's rows; 64 and 128 are)."""
    half = x.shape[-1] // 2
    sized = x.shape[-1] == 2 * half and half & (half - 1) == 0
    return x.dtype in (torch.bfloat16, torch.float16) and cos.dtype == x.dtype and sized


def rope_fused(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """The Triton kernel (contract above); returns a new (T, H, D) tensor."""
    if not takes(x, cos):
        raise ValueError(
            f"rope_fused takes 16-bit x and tables of its dtype and a head dim twice a "
            f"power of two, got {x.dtype}, {cos.dtype}, {x.shape[-1]}"
        )
    t, heads, dim = x.shape
    cos, sin = cos.reshape(t, dim), sin.reshape(t, dim)  # (T, D)
    if x.stride(-1) != 1 or cos.stride(-1) != 1 or sin.stride() != cos.stride():
        raise ValueError("rope_fused needs the head dim contiguous and like tables")
    out = torch.empty((t, heads, dim), dtype=x.dtype, device=x.device)
    if t:
        _kernel()[(t, heads)](
            x, cos, sin, out, x.stride(0), x.stride(1), cos.stride(0),
            out.stride(0), out.stride(1), HALF=dim // 2,
        )  # fmt: skip
    return out
