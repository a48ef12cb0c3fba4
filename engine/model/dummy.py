"""Dummy models: real architectures and shapes with random weights, for measuring speed
where weights cannot be downloaded (vLLM's `--load-format dummy`).

`dummy:<shape>` (`SHAPES`) names a model whose config is the real model's (layers,
widths, heads, head size, RoPE and its scaling, positions) but for the vocabulary,
which is the default model's: its tokenizer and chat template come with it, so
every pattern runs on it unchanged. Its directory under `$CORPS_HOME/models`
holds the config and the tokenizer, no weights; loading builds the architecture
on the engine's device in its dtype and fills it there with seeded random values
(the same weights on every load), so nothing of the model's size touches the disk.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from corps.engine.errors import ModelNotFound
from corps.engine.model.staging import staged

PREFIX = "dummy:"
#: the file that marks a dummy model's directory (it has no weights)
MARKER = "corps_dummy.json"
#: the seed of every dummy model's weights
SEED = 0

_LLAMA3_ROPE = dict(rope_type="llama3", low_freq_factor=1.0, high_freq_factor=4.0)
#: shape name -> (model_type, the real model's config but its vocabulary)
SHAPES: dict[str, tuple[str, dict]] = {
    # not a real model: two narrow layers, for measuring the host's share of a step
    "tiny": ("llama", dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=10000.0,
        max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=True,
    )),
    "llama-3.2-1b": ("llama", dict(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, rope_theta=500000.0,
        rope_scaling=dict(_LLAMA3_ROPE, factor=32.0, original_max_position_embeddings=8192),
        max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=True,
    )),
    "llama-3.1-8b": ("llama", dict(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, rope_theta=500000.0,
        rope_scaling=dict(_LLAMA3_ROPE, factor=8.0, original_max_position_embeddings=8192),
        max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=False,
    )),
    "qwen2.5-7b": ("qwen2", dict(
        hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4, rope_theta=1000000.0,
        max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=False,
    )),
    "qwen3-8b": ("qwen3", dict(
        hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, rope_theta=1000000.0,
        max_position_embeddings=40960, rms_norm_eps=1e-6, tie_word_embeddings=False,
    )),
    "mistral-7b": ("mistral", dict(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, rope_theta=1000000.0,
        max_position_embeddings=32768, rms_norm_eps=1e-5, tie_word_embeddings=False,
        sliding_window=None,
    )),
}  # fmt: skip


def is_dummy_name(name: str) -> bool:
    return name.startswith(PREFIX)


def is_dummy_dir(path: str | Path) -> bool:
    return (Path(path) / MARKER).is_file()


def dummy_config(shape: str, vocab_size: int):
    """The transformers config of `shape` with `vocab_size` tokens."""
    from transformers import AutoConfig

    if shape not in SHAPES:
        known = ", ".join(PREFIX + s for s in SHAPES)
        raise ModelNotFound(f"unknown dummy model {PREFIX}{shape}: pick one of {known}")
    model_type, kwargs = SHAPES[shape]
    return AutoConfig.for_model(model_type, vocab_size=vocab_size, **kwargs)


def install_dummy(shape: str, target: Path, tokenizer_dir: Path) -> Path:
    """Write `shape`'s directory at `target` (config, the tokenizer files of
    `tokenizer_dir`, the marker), atomically; returns `target`."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    config = dummy_config(shape, len(tokenizer))
    with staged(target, f".dummy-{shape}-", is_dummy_dir) as work:
        out = work / "model"
        config.save_pretrained(str(out))
        tokenizer.save_pretrained(str(out))
        (out / MARKER).write_text(json.dumps({"shape": shape, "seed": SEED}) + "\n")
    return target


def build_dummy(path: str | Path, *, dtype: torch.dtype, device: str | torch.device = "cpu"):
    """The transformers model of a dummy directory: built on `device` in `dtype`, its
    weights drawn there from a fixed seed (transformers' own initialisation)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(path))
    devices = [device] if torch.device(device).type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(SEED)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()
