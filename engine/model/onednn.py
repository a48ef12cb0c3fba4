"""oneDNN's blocked weight layout on CPU: packing a weight, the product over it,
unpacking it, and the probe of whether this torch has a working oneDNN linear.

These are torch's private ops (`torch.ops.mkldnn`, used by inductor); the probe
checks them against `F.linear` once per process and dtype before anything uses them.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor


def onednn_pack(w: Tensor) -> Tensor | None:
    """W (N, K) bfloat16 or float32 in oneDNN's blocked layout for any row count, or
    None where this torch or device has no working oneDNN linear of that dtype (then
    `F.linear` takes W)."""
    if w.device.type != "cpu" or not _onednn_linear_works(w.dtype):
        return None
    return torch.ops.mkldnn._reorder_linear_weight(w, None)


@functools.cache
def _onednn_linear_works(dtype: torch.dtype) -> bool:
    """Probe once per process and dtype: oneDNN's prepacked linear exists here and
    gives what `F.linear` gives (these are torch's private ops, used by inductor):
    bit for bit in bfloat16, to float32 rounding in float32 (sums may be ordered
    differently)."""
    if not torch.backends.mkldnn.is_available():
        return False
    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, 32, generator=g).to(dtype)
    x = torch.randn(5, 32, generator=g).to(dtype)
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
        y = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    except (RuntimeError, AttributeError, NotImplementedError):
        return False
    ref = F.linear(x, w)
    if dtype == torch.bfloat16:
        return bool(torch.equal(y, ref))
    return y.shape == ref.shape and bool(torch.allclose(y, ref, rtol=1e-5, atol=1e-5))


def unpack_onednn(packed: Tensor, in_features: int) -> Tensor:
    """W (N, K) back from its blocked layout (`onednn_pack`), in its dtype, exactly:
    the product of the identity with W has one non-zero term per sum. (N, K)."""
    eye = torch.eye(in_features, dtype=packed.dtype, device=packed.device)  # (K, K)
    wt = torch.ops.mkldnn._linear_pointwise(eye, packed, None, "none", [], "")  # (K, N)
    return wt.t().contiguous()


def packed_product(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    """x (M, K) times W held in oneDNN's blocked layout (`onednn_pack`), plus b (N,)
    if given, all in W's dtype (float32 or bfloat16): (M, N) in that dtype. A captured
    step calls it only for float32 (`corps.engine.model.decode_module`)."""
    return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")
