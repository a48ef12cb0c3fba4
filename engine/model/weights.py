"""Weights of a Llama-family decoder, taken from a Hugging Face model and fused for our forward."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from corps.cache.rope import RopeTables
from corps.engine.errors import BadWeights, ModelNotFound, UnsupportedModel
from corps.engine.model.adapter_rows import RowGate, gated, merge_into
from corps.engine.model.dummy import build_dummy, is_dummy_dir
from corps.engine.model.linear import Linear, TunedLinear
from corps.engine.model.names import GGUF_NAME
from corps.engine.model.quantized import Int4Linear, Int8Linear, Quantized
from corps.engine.model.spec import ModelSpec
from corps.engine.model.tuning import KernelChoice

#: Longest RoPE table we precompute, whatever the config claims.
MAX_TABLE_POSITIONS = 131072


#: a projection x (M, K) -> (M, N): dense layouts, or quantized codes
Projection = Linear | TunedLinear | Quantized

#: `EngineConfig.weights`: how projections hold their weights. "auto": a model
#: directory holding its GGUF (`model.gguf`, the embedded default) runs the file's
#: own blocks ("gguf"), any other model is "dense"; "int8" / "int4": quantized on
#: load, round to nearest (`corps.engine.model.quantized`).
WEIGHT_FORMATS = ("auto", "dense", "gguf", "int8", "int4")


@dataclass(frozen=True)
class LayerWeights:
    input_norm: Tensor  # (E,)
    qkv: Projection  # E -> (Hq + 2 Hkv) D: q, k, v stacked (with Qwen2's bias)
    q_norm: Tensor | None  # (D,) Qwen3
    k_norm: Tensor | None  # (D,) Qwen3
    o: Projection  # Hq D -> E
    post_norm: Tensor  # (E,)
    gate_up: Projection  # E -> 2 I: gate and up projections stacked
    down: Projection  # I -> E


@dataclass(frozen=True)
class Weights:
    spec: ModelSpec
    # (V, E), float16 in mixed precision (rows are cast on lookup); or quantized
    # codes whose rows are de-quantized on lookup (the tied head itself)
    embed: Tensor | Quantized
    layers: tuple[LayerWeights, ...]
    final_norm: Tensor  # (E,)
    lm_head: Projection  # E -> V (its weight is the embedding itself when tied)
    rope: RopeTables
    # an adapter of scope "rewired" kept apart: which rows of a step it applies to
    lora: RowGate | None = None

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype (and the KV store's)."""
        return self.final_norm.dtype

    @property
    def device(self) -> torch.device:
        return self.final_norm.device

    def embedding(self, ids: Tensor) -> Tensor:
        """The embeddings (T, E) of token ids (T,), in the activations' dtype."""
        if isinstance(self.embed, Tensor):
            return self.embed[ids].to(self.dtype)
        return self.embed.rows(ids).to(self.dtype)

    @property
    def quantized(self) -> bool:
        """Whether any projection holds quantized codes."""
        return any(isinstance(p, (Int4Linear, Int8Linear)) for p in self.projections)

    @property
    def projections(self) -> list[Projection]:
        """Every projection, the output head last."""
        projs = [p for lw in self.layers for p in (lw.qkv, lw.o, lw.gate_up, lw.down)]
        return [*projs, self.lm_head]

    @property
    def nbytes(self) -> int:
        """Bytes of every weight held, each projection's layouts included (the
        embedding once when the head is tied to it)."""
        norms = [self.final_norm] + [
            n for lw in self.layers for n in (lw.input_norm, lw.post_norm, lw.q_norm, lw.k_norm)
        ]
        projs = self.projections
        small = norms + [p.b for p in projs[:-1]]
        total = sum(p.weight_bytes for p in projs)
        if isinstance(self.embed, Tensor) and not self.lm_head.holds(self.embed):  # untied
            small.append(self.embed)
        elif not isinstance(self.embed, Tensor) and self.embed is not self.lm_head:
            total += self.embed.weight_bytes
        return total + sum(t.numel() * t.element_size() for t in small if t is not None)


def read_spec(path: str | Path) -> ModelSpec:
    """Read and check a model's config without loading its weights."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(path))
    except (OSError, ValueError) as exc:
        raise ModelNotFound(
            f"no model config at {path!s}: give a directory holding config.json and "
            f"safetensors weights, a hub id, or an alias from `corps models`"
        ) from exc
    return ModelSpec.from_config(config)


#: dtype name (`EngineConfig.dtype`) -> the dtype of weights, activations and the KV
#: store. "mixed" is float32 except the projections' weights: float16 for one row,
#: bfloat16 for more (`corps.engine.model.linear`).
_TORCH_DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "mixed": torch.float32,
    "auto": torch.float32,
}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of weights, activations and KV store for a dtype name."""
    return _TORCH_DTYPES[name]


def load_weights(
    path: str | Path,
    *,
    dtype: torch.dtype,
    device: str | torch.device,
    mixed: bool = False,
    choice: KernelChoice | None = None,
    adapter: str | Path | None = None,
    adapter_copy: bool = True,
    weights: str = "auto",
) -> Weights:
    """Load an HF checkpoint with transformers and keep its tensors in our fused layout.

    `mixed`: projections keep 16-bit weights and pick float16 or bfloat16 by row
    count (see `corps.engine.model.linear`); everything else stays in `dtype`.
    `choice`: projections use the kernels measured fastest here (`dtype="auto"`).
    `weights`: a format of `WEIGHT_FORMATS` ("auto" resolved by `weight_source`):
    quantized projections replace the dense ones; norms, biases and RoPE stay.
    `adapter`: a LoRA adapter directory merged into the weights first (`load_hf`),
    or, for an adapter of scope "rewired", kept apart (`corps.engine.model.adapter_rows.gated`),
    with a merged copy of the projections it adapts when `adapter_copy`."""
    from corps.engine.model.adapter_files import apart, read_scope

    spec = read_spec(path)
    fmt = weight_source(weights, path, adapter)
    quant = quantizer(fmt, path, spec, device)
    kw = {"device": device, "mixed": mixed, "choice": choice, "quant": quant}
    if adapter is None or read_scope(adapter) == "all":
        hf = load_hf(path, dtype=dtype, adapter=adapter, device=device)
        return weights_from_hf(hf, spec, **kw)
    hf, factors = apart(load_hf(path, dtype=torch.float32), adapter)
    merged = None
    if adapter_copy:
        whole = merge_into(hf, factors).to(dtype)
        merged = weights_from_hf(whole, spec, **kw)
        del whole
    w = weights_from_hf(hf.to(dtype), spec, **kw)
    return gated(w, factors, merged)


def weight_source(weights: str, path: str | Path, adapter: str | Path | None = None) -> str:
    """The format `weights` names for the model at `path`: "auto" is "gguf" where the
    directory holds its GGUF and no adapter is merged (an adapter changes the weights
    the file holds), else "dense"; "gguf" without a file is a typed error."""
    if weights not in WEIGHT_FORMATS:
        raise ValueError(f"weights must be one of {', '.join(WEIGHT_FORMATS)}, got {weights!r}")
    has_file = (Path(path) / GGUF_NAME).is_file()
    if weights == "auto":
        return "gguf" if has_file and adapter is None else "dense"
    if weights == "gguf" and adapter is not None:
        raise BadWeights(
            "weights='gguf' runs the file's blocks as they are, and an adapter changes them: "
            "use weights='dense' (or 'int4' to quantize the adapted weights)"
        )
    if weights == "gguf" and not has_file:
        raise BadWeights(
            f"weights='gguf' needs {Path(path) / GGUF_NAME}: this model directory holds no "
            f"GGUF file; use weights='int4' to quantize its weights on load"
        )
    return weights


def quantizer(fmt: str, path: str | Path, spec: ModelSpec, device):
    """How each projection is built in format `fmt` (see `weights_from_hf`): None for
    dense, else a function (key, W (N, K), b) -> a quantized projection, or None where
    the format has no kernel for that weight (it stays dense)."""
    if fmt == "dense":
        return None
    if fmt == "gguf":
        from corps.engine.model.gguf_weights import GgufWeights

        source = GgufWeights(Path(path) / GGUF_NAME, spec)
        return lambda key, w, b: source.projection(key, tuple(w.shape), b, device=w.device)
    cls = Int4Linear if fmt == "int4" else Int8Linear
    return lambda key, w, b: cls.quantize(w, b) if w.shape[1] % 32 == 0 else None


def load_hf(
    path: str | Path,
    *,
    dtype: torch.dtype,
    adapter: str | Path | None = None,
    device: str | torch.device = "cpu",
):
    """The transformers model at `path` in `dtype`, with a LoRA adapter merged into its
    weights in float32 first when one is given (`corps.engine.model.adapter_files`). A
    checkpoint loads on the CPU; a dummy model (`corps.engine.model.dummy`) is built on
    `device` (on the CPU when an adapter is merged into it)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from corps.engine.model.adapter_files import merge

    hf_logging.disable_progress_bar()
    if is_dummy_dir(path):
        if adapter is None:
            return build_dummy(path, dtype=dtype, device=device)
        return merge(build_dummy(path, dtype=torch.float32), adapter).to(dtype)
    if adapter is None:
        return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    return merge(hf, adapter).to(dtype)


def weights_from_hf(
    hf,
    spec: ModelSpec,
    *,
    device: str | torch.device = "cpu",
    mixed: bool = False,
    choice: KernelChoice | None = None,
    quant=None,
) -> Weights:
    """Take the tensors of a loaded HF Llama-family model (hf: PreTrainedModel).
    `quant` (`quantizer`): quantized projections by key ("layers.3.qkv", "lm_head",
    "embed"), where it gives one."""
    inner = getattr(hf, "model", None)
    if inner is None or not hasattr(inner, "layers"):
        raise UnsupportedModel(f"{type(hf).__name__} has no decoder layers corps can read")

    def t(x: Tensor) -> Tensor:
        return x.detach().to(device).contiguous()

    def lin(key: str, w: Tensor, b: Tensor | None = None) -> Projection:
        q = None if quant is None else quant(key, w, b)
        if q is not None:
            return q
        if choice is not None:
            return TunedLinear.of(w, b, choice)
        return Linear.of(w, b, mixed=mixed)

    layers = []
    for i, layer in enumerate(inner.layers):
        att, mlp = layer.self_attn, layer.mlp
        biases = [att.q_proj.bias, att.k_proj.bias, att.v_proj.bias]
        layers.append(
            LayerWeights(
                input_norm=t(layer.input_layernorm.weight),
                qkv=lin(
                    f"layers.{i}.qkv",
                    t(torch.cat([att.q_proj.weight, att.k_proj.weight, att.v_proj.weight])),
                    t(torch.cat(biases)) if all(b is not None for b in biases) else None,
                ),
                q_norm=t(att.q_norm.weight) if spec.qk_norm else None,
                k_norm=t(att.k_norm.weight) if spec.qk_norm else None,
                o=lin(f"layers.{i}.o", t(att.o_proj.weight)),
                post_norm=t(layer.post_attention_layernorm.weight),
                gate_up=lin(
                    f"layers.{i}.gate_up", t(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
                ),
                down=lin(f"layers.{i}.down", t(mlp.down_proj.weight)),
            )
        )
    embed = t(inner.embed_tokens.weight)
    lm_head = hf.get_output_embeddings().weight
    tied = lm_head.data_ptr() == inner.embed_tokens.weight.data_ptr()
    positions = min(spec.max_positions, MAX_TABLE_POSITIONS)
    rope = RopeTables.from_hf_rotary(inner.rotary_emb, positions, embed.dtype)
    head = lin("lm_head", embed if tied else t(lm_head))
    embed = _embedding(embed, head if tied else None, quant, mixed)
    return Weights(
        spec=spec,
        embed=embed,
        layers=tuple(layers),
        final_norm=t(inner.norm.weight),
        lm_head=head,
        rope=RopeTables(cos=rope.cos.to(device), sin=rope.sin.to(device)),
    )


def _embedding(embed: Tensor, head: Projection | None, quant, mixed: bool) -> Tensor | Quantized:
    """The embedding table as lookups read it: the tied head's quantized codes where
    they serve row lookups here (on a CPU), an untied embedding's own quantized codes,
    or the dense table (float16 in mixed precision: the tied head's own copy)."""
    on_cpu = embed.device.type == "cpu"
    if isinstance(head, (Int4Linear, Int8Linear)) and on_cpu:
        return head
    if head is None and quant is not None and on_cpu:
        table = quant("embed", embed, None)
        if table is not None:
            return table
    if mixed:
        few = head.few if isinstance(head, Linear) else None
        return few if few is not None else embed.to(torch.float16)
    return embed
