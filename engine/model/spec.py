"""What the forward pass needs to know about a model, read off its HF config."""

from __future__ import annotations

from dataclasses import dataclass

from corps.engine.errors import UnsupportedModel

SUPPORTED_ARCHITECTURES = frozenset(
    {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"}
)


@dataclass(frozen=True)
class ModelSpec:
    """Shapes and flags of a Llama-family RoPE decoder.

    Biases, q/k norms and tied embeddings come with the HF modules themselves.
    """

    vocab_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_positions: int
    qk_norm: bool
    hidden_size: int = 0  # the residual stream's width (0: unknown)
    intermediate_size: int = 0  # the MLP's inner width (0: unknown)

    @classmethod
    def from_config(cls, config) -> ModelSpec:  # config: transformers.PretrainedConfig
        archs = list(getattr(config, "architectures", None) or [])
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            arch = _arch_from_model_type(getattr(config, "model_type", ""))
        if arch is None:
            named = ", ".join(archs) or getattr(config, "model_type", "?")
            raise UnsupportedModel(
                f"unsupported architecture {named}: corps runs RoPE decoders of the Llama "
                f"family ({', '.join(sorted(SUPPORTED_ARCHITECTURES))}); pick one of those"
            )
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return cls(
            vocab_size=config.vocab_size,
            num_layers=config.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
            rms_norm_eps=float(config.rms_norm_eps),
            max_positions=int(getattr(config, "max_position_embeddings", 4096)),
            qk_norm=arch == "Qwen3ForCausalLM",
            hidden_size=int(config.hidden_size),
            intermediate_size=int(getattr(config, "intermediate_size", 0) or 0),
        )


def _arch_from_model_type(model_type: str) -> str | None:
    return {
        "llama": "LlamaForCausalLM",
        "mistral": "MistralForCausalLM",
        "qwen2": "Qwen2ForCausalLM",
        "qwen3": "Qwen3ForCausalLM",
    }.get(model_type)
