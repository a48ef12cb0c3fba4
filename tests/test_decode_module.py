"""The captured step's weights as frozen parameters (corps.engine.model.decode_module)."""

from __future__ import annotations

import pytest
import torch
from test_tuning import fake

from corps.engine.model import tuning
from corps.engine.model.decode_module import StepWeights
from corps.engine.model.spec import ModelSpec
from corps.engine.model.weights import read_spec, weights_from_hf


def _weights(tiny_hf, tiny_dirs, arch: str, **kwargs):
    spec: ModelSpec = read_spec(tiny_dirs[arch])
    return weights_from_hf(tiny_hf[arch], spec, **kwargs)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("one_row", ["float32-t", "float32-packed", "float16", "bfloat16-packed"])
def test_each_projection_gives_the_eager_one_row_product(tiny_hf, tiny_dirs, arch, one_row):
    if one_row not in tuning.available():
        pytest.skip(f"{one_row} is not available in this torch")
    choice = tuning.choose(fake({1: one_row}), tuning.available())
    w = _weights(tiny_hf, tiny_dirs, arch, choice=choice)
    frozen = StepWeights(w)
    assert not any(p.requires_grad for p in frozen.parameters())
    pairs = [(lw.qkv, fl.qkv) for lw, fl in zip(w.layers, frozen.layers, strict=True)]
    pairs += [(w.layers[0].down, frozen.layers[0].down), (w.lm_head, frozen.lm_head)]
    g = torch.Generator().manual_seed(0)
    for eager, step in pairs:
        x = torch.randn(1, eager.in_features, generator=g)  # (1, K)
        torch.testing.assert_close(step(x), eager(x), rtol=1e-5, atol=1e-5)
    assert frozen.layers[0].qkv.weight.dtype == {
        "float32-t": torch.float32, "float32-packed": torch.float32,
        "float16": torch.float16, "bfloat16-packed": torch.bfloat16,
    }[one_row]  # fmt: skip
    # float32-packed: the graph reads the eager layout itself (oneDNN, not MKL)
    assert frozen.layers[0].qkv.packed == (one_row == "float32-packed")
    assert (frozen.layers[0].q_norm is None) == (arch != "qwen3")
    assert (frozen.layers[0].qkv.bias is None) == (arch != "qwen2")


def test_float32_weights_are_shared_not_copied(tiny_hf, tiny_dirs):
    w = _weights(tiny_hf, tiny_dirs, "llama")
    frozen = StepWeights(w)
    assert frozen.layers[0].gate_up.weight.data_ptr() == w.layers[0].gate_up.w.data_ptr()
    assert frozen.final_norm.data_ptr() == w.final_norm.data_ptr()
