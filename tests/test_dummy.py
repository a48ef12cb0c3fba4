"""model/dummy.py: real shapes with random weights, built on the engine's device from a
fixed seed, named `dummy:<shape>` wherever a model is."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoTokenizer
from typer.testing import CliRunner

from corps.cli.app import app
from corps.engine import Engine, ModelNotFound
from corps.engine.model import dummy, names
from corps.engine.model.spec import ModelSpec

#: the published shapes: (layers, hidden, heads, kv heads, head dim, intermediate)
PUBLISHED = {
    "llama-3.2-1b": (16, 2048, 32, 8, 64, 8192),
    "llama-3.1-8b": (32, 4096, 32, 8, 128, 14336),
    "qwen2.5-7b": (28, 3584, 28, 4, 128, 18944),
    "qwen3-8b": (36, 4096, 32, 8, 128, 12288),
    "mistral-7b": (32, 4096, 32, 8, 128, 14336),
}


@pytest.mark.parametrize("shape", sorted(PUBLISHED))
def test_every_shape_is_the_published_model_but_its_vocabulary(shape):
    spec = ModelSpec.from_config(dummy.dummy_config(shape, 49152))
    got = (spec.num_layers, spec.hidden_size, spec.num_heads, spec.num_kv_heads,
           spec.head_dim, spec.intermediate_size)  # fmt: skip
    assert got == PUBLISHED[shape] and spec.vocab_size == 49152
    assert spec.qk_norm == shape.startswith("qwen3")


def test_the_shapes_are_the_ones_listed():  # and "tiny", for the host's share of a step
    assert sorted(dummy.SHAPES) == sorted([*PUBLISHED, "tiny"])


def test_an_unknown_shape_says_which_there_are(tmp_path, monkeypatch):
    monkeypatch.setenv("CORPS_HOME", str(tmp_path))
    with pytest.raises(ModelNotFound, match=r"dummy:llama-3\.1-8b"):
        names.resolve_model("dummy:gpt-5")
    assert not (tmp_path / "models").exists()  # nothing fetched or written


@pytest.fixture
def tiny_shape(tiny_dirs, tmp_path, monkeypatch):
    """A small shape of the real kind, the tiny test tokenizer as the default model's."""
    monkeypatch.setenv("CORPS_HOME", str(tmp_path))
    monkeypatch.setattr(names, "DEFAULT_MODEL", str(tiny_dirs["llama"]))
    small = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 rope_theta=10000.0, max_position_embeddings=512, rms_norm_eps=1e-5,
                 tie_word_embeddings=False)  # fmt: skip
    monkeypatch.setitem(dummy.SHAPES, "tiny", ("llama", small))
    return "dummy:tiny"


async def _greedy(model: str, **kw) -> str:
    async with Engine.open(model, dtype="float32", **kw) as engine:
        q = await engine.prefill("hello world")
        out = await engine.decode(parents=[q], max_tokens=8, ignore_eos=True)
        return out.text


async def test_a_dummy_model_runs_and_has_the_same_weights_on_every_load(tiny_shape, tmp_path):
    first = await _greedy(tiny_shape)
    path = tmp_path / "models" / "dummy-tiny"
    assert dummy.is_dummy_dir(path) and not list(path.glob("*.safetensors"))  # no weights
    assert first == await _greedy(tiny_shape)  # the same seed, the same weights
    assert first == await _greedy(tiny_shape, mode="baseline")


def test_a_dummy_model_is_built_in_the_dtype_asked(tiny_shape):
    path = names.resolve_model(tiny_shape)
    hf = dummy.build_dummy(path, dtype=torch.bfloat16)
    assert {p.dtype for p in hf.parameters()} == {torch.bfloat16}
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    assert hf.config.vocab_size == len(tokenizer)  # the default model's vocabulary


def test_corps_models_lists_the_dummy_shapes(tmp_path, monkeypatch):
    monkeypatch.setenv("CORPS_HOME", str(tmp_path))
    result = CliRunner().invoke(app, ["models"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for shape in PUBLISHED:
        assert f"dummy:{shape}" in result.output


def test_a_carried_tokenizer_serves_where_the_default_model_is_not(
    tiny_dirs, tmp_path, monkeypatch
):
    """The GPU machine has no default model: its tokenizer files travel instead."""
    carried = tmp_path / "tokenizer"
    AutoTokenizer.from_pretrained(str(tiny_dirs["llama"])).save_pretrained(str(carried))
    monkeypatch.setenv("CORPS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CORPS_DUMMY_TOKENIZER", str(carried))
    monkeypatch.setattr(names, "DEFAULT_MODEL", "no-such-model")  # never looked up
    path = names.resolve_model("dummy:llama-3.2-1b")
    assert dummy.is_dummy_dir(path)
    vocab = AutoConfig.from_pretrained(str(path)).vocab_size
    assert vocab == len(AutoTokenizer.from_pretrained(str(carried)))  # its vocabulary
    monkeypatch.setenv("CORPS_DUMMY_TOKENIZER", str(tmp_path))
    with pytest.raises(ModelNotFound, match="CORPS_DUMMY_TOKENIZER"):
        names.resolve_model("dummy:llama-3.1-8b")
