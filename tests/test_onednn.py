"""model/onednn.py: the probe of oneDNN's linear in this torch, and packing a weight
into its blocked layout and back."""

from __future__ import annotations

import pytest
import torch

from corps.engine.model import onednn


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_onednn_probe_agrees_with_this_torch(dtype):
    """On this machine's torch the probe runs for real (no monkeypatch): it must not
    raise, and where it says yes, packing really happens."""
    works = onednn._onednn_linear_works(dtype)
    packed = onednn.onednn_pack(torch.randn(8, 8).to(dtype))
    assert (packed is not None) == works


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_blocked_weight_unpacks_to_itself_exactly(dtype):
    if not onednn._onednn_linear_works(dtype):
        pytest.skip(f"no oneDNN {dtype} linear in this torch")
    w = torch.randn(40, 24, generator=torch.Generator().manual_seed(3)).to(dtype)
    packed = onednn.onednn_pack(w)
    back = onednn.unpack_onednn(packed, 24)
    assert back.dtype == dtype and back.shape == (40, 24) and back.is_contiguous()
    assert torch.equal(back, w)
