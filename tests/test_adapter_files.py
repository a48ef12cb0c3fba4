"""LoRA adapters in PEFT's format (model/adapter_files.py): made, checked, merged, served."""

from __future__ import annotations

import json

import pytest
import torch

from corps.engine.config import BadConfig, EngineConfig
from corps.engine.errors import BadAdapter
from corps.engine.model.adapter_files import check_fits, read_adapter_config

from conftest import open_tiny
from helpers import hf_model, peft_adapter


@pytest.mark.parametrize("mode", ["choreographed", "baseline", "hf"])
async def test_a_peft_adapter_served_by_corps_gives_peft_logits(tiny_dirs, tmp_path, mode):
    lora = peft_adapter(tiny_dirs["qwen2"], tmp_path / "a")
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        "README.md", "adapter_config.json", "adapter_model.safetensors"
    ]  # fmt: skip
    async with open_tiny(tiny_dirs, "qwen2", adapter=tmp_path / "a", mode=mode) as engine:
        q = await engine.prefill("hello world")
        h = await engine.decode(parents=[q], force=[7, 8, 9, 10], logprobs=True)
        plain_prompt = engine.chat.sink + q.tokens + h.tokens[: h.generated_from + 4]
    with torch.no_grad():
        logits = lora(torch.tensor([plain_prompt])).logits[0].double()
    rows = torch.log_softmax(logits, -1)[-5:-1]
    want = [float(r[t]) for r, t in zip(rows, [7, 8, 9, 10], strict=True)]
    assert list(h.logprobs) == pytest.approx(want, abs=1e-4)
    async with open_tiny(tiny_dirs, "qwen2", mode=mode) as engine:  # without: different
        q = await engine.prefill("hello world")
        base = await engine.decode(parents=[q], force=[7, 8, 9, 10], logprobs=True)
    assert max(abs(a - b) for a, b in zip(base.logprobs, h.logprobs, strict=True)) > 1e-3


async def test_an_adapter_serves_in_the_16_bit_paths(tiny_dirs, tmp_path):
    peft_adapter(tiny_dirs["llama"], tmp_path / "a")
    for dtype in ("auto", "bfloat16"):
        async with open_tiny(tiny_dirs, "llama", adapter=tmp_path / "a", dtype=dtype) as e:
            q = await e.prefill("hello")
            assert (await e.decode(parents=[q], max_tokens=3)).generated


def test_bad_adapters_fail_in_one_clear_line_before_loading(tiny_dirs, tmp_path):
    with pytest.raises(BadConfig, match="not a directory"):
        EngineConfig.of(adapter=tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BadConfig, match=r"has no adapter_config\.json, adapter_model\.safetensors"):
        EngineConfig.of(adapter=tmp_path / "empty")
    peft_adapter(tiny_dirs["llama"], tmp_path / "ia3")
    cfg = json.loads((tmp_path / "ia3" / "adapter_config.json").read_text())
    (tmp_path / "ia3" / "adapter_config.json").write_text(json.dumps({**cfg, "peft_type": "IA3"}))
    with pytest.raises(BadAdapter, match="holds a 'IA3' adapter; corps serves LoRA"):
        read_adapter_config(tmp_path / "ia3")


def test_an_adapter_for_another_model_or_rank_is_refused(tiny_dirs, tmp_path):
    peft_adapter(tiny_dirs["llama"], tmp_path / "r4", rank=4)
    cfg_path = tmp_path / "r4" / "adapter_config.json"
    cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), "r": 8}))
    with pytest.raises(BadAdapter, match=r"rank 8 in adapter_config.json"):
        check_fits(hf_model(tiny_dirs["llama"]), tmp_path / "r4")
    other = hf_model(tiny_dirs["llama"])
    other.model.layers = other.model.layers[:1]  # an architecture with fewer layers
    peft_adapter(tiny_dirs["llama"], tmp_path / "l")
    with pytest.raises(BadAdapter, match="which this model does not have"):
        check_fits(other, tmp_path / "l")


async def test_an_engine_with_a_bad_adapter_loads_nothing(tiny_dirs, tmp_path):
    peft_adapter(tiny_dirs["llama"], tmp_path / "r4")
    cfg_path = tmp_path / "r4" / "adapter_config.json"
    cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), "r": 8}))
    with pytest.raises(BadAdapter, match="rank 8"):
        async with open_tiny(tiny_dirs, "llama", adapter=tmp_path / "r4"):
            pass
