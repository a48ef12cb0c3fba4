"""A GGUF file's projections as they are: 4-bit blocks stay 4-bit, wider ones 4-bit halves.

Read with the `gguf` package (llama.cpp's own reader, memory-mapped). Block types
(`gguf_blocks` says how each is read):

- Q4_0, Q4_1 and Q4_K -> `Int4Linear` groups of 32: the same codes, each group's
  scale and zero rounded to bfloat16 (the kernel's dtype);
- Q8_0, Q5_0, Q5_1 and Q5_K -> `Int4Linear.from_int8_groups`: the same codes as two
  4-bit halves, exact but for the same rounding;
- anything else the `gguf` package decodes (F32, F16, BF16, Q6_K, Q2_K, Q3_K, ...) ->
  its float32 values, kept dense by the caller (no kernel runs those blocks as they
  are: their groups of 16 are narrower than the kernel's 32).

A fused projection (q, k, v; gate and up) keeps its members' codes only when they are
all 4-bit groups (Q4_*) or all split (Q8_0, Q5_*); a mix is de-quantized. llama.cpp
stores a Llama model's q and k rows permuted for its RoPE layout; they are put back
in Hugging Face's order here, as transformers' own GGUF loader does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from corps.engine.errors import BadWeights
from corps.engine.model.gguf_blocks import SIZES, Blocks, decode
from corps.engine.model.quantized import Int4Linear
from corps.engine.model.spec import ModelSpec

#: our fused projection -> its members' GGUF tensors (of layer {i})
MEMBERS = {
    "qkv": ("attn_q", "attn_k", "attn_v"),
    "o": ("attn_output",),
    "gate_up": ("ffn_gate", "ffn_up"),
    "down": ("ffn_down",),
}


class GgufWeights:
    """The projections of one GGUF file, by our names ("layers.3.qkv", "lm_head", "embed")."""

    def __init__(self, path: str | Path, spec: ModelSpec) -> None:
        import gguf

        self.path = Path(path)
        self.spec = spec
        try:
            self.reader = gguf.GGUFReader(str(self.path))
        except Exception as exc:  # a truncated or foreign file fails in many ways
            raise BadWeights(
                f"{self.path} is not a readable GGUF file ({type(exc).__name__}); fetch it "
                f"again, or load the model with weights='dense'"
            ) from exc
        self.tensors = {t.name: t for t in self.reader.tensors}
        arch = self.reader.fields.get("general.architecture")
        self.arch = bytes(arch.parts[-1]).decode() if arch is not None else ""

    def names(self, key: str) -> list[str]:
        """The GGUF tensors behind one of our projections."""
        if key == "lm_head":
            return ["output.weight" if "output.weight" in self.tensors else "token_embd.weight"]
        if key == "embed":
            return ["token_embd.weight"]
        _, i, ours = key.split(".")
        return [f"blk.{i}.{m}.weight" for m in MEMBERS[ours]]

    def projection(self, key: str, shape: tuple[int, int], b: Tensor | None, device="cpu"):
        """Our projection `key` of `shape` (N, K) as an `Int4Linear` on `device`, or None
        when its blocks have no kernel (the caller keeps the dense values)."""
        parts = [self.blocks(name) for name in self.names(key)]
        if any(p is None for p in parts):
            return None
        n = sum(p.codes.shape[0] for p in parts)
        if (n, parts[0].codes.shape[1]) != shape:
            raise BadWeights(
                f"{self.path}: {', '.join(self.names(key))} hold {n} x {parts[0].codes.shape[1]} "
                f"weights where the model's config gives {shape[0]} x {shape[1]}; the GGUF and "
                f"the config are of different models"
            )
        kinds = {p.kind for p in parts}
        if len(kinds) > 1:
            return None
        codes, scale, zero = (
            torch.cat([getattr(p, f) for p in parts]).to(device) for f in ("codes", "scale", "zero")
        )
        if kinds == {"split"}:
            return Int4Linear.from_int8_groups(codes, scale, b, plus=zero)
        return Int4Linear.of_codes(codes, scale, zero, b)

    def blocks(self, name: str) -> Blocks | None:
        """A tensor's blocks in our row order, or None for a type without a kernel."""
        t = self._tensor(name)
        kind = t.tensor_type.name
        if kind not in SIZES:
            self._decodable(t)
            return None
        k, n = (int(x) for x in t.shape)  # ggml order: (K, N)
        per, size = SIZES[kind]
        raw = np.asarray(t.data, dtype=np.uint8)
        if k % per or raw.size != n * (k // per) * size:
            raise BadWeights(
                f"{self.path}: tensor {name} holds {raw.size} bytes, not {kind} "
                f"blocks of {n} x {k}; the file is damaged: fetch it again"
            )
        got = decode(kind, raw, n, k)
        order = self._row_order(name, n)
        return Blocks(got.kind, got.codes[order], got.scale[order], got.zero[order])

    def dense(self, name: str) -> Tensor:
        """A tensor's float32 values (N, K), rows in our order (the reference path)."""
        import gguf

        t = self._tensor(name)
        self._decodable(t)
        w = gguf.quants.dequantize(t.data, t.tensor_type)
        w = torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32))
        w = w.reshape(int(t.shape[1]), int(t.shape[0]))
        return w[self._row_order(name, w.shape[0])]

    def _decodable(self, t) -> None:
        """Refuse a tensor whose blocks nothing decodes (its first block tried)."""
        import gguf

        try:
            block = gguf.GGML_QUANT_SIZES[t.tensor_type][1]
            gguf.quants.dequantize(np.zeros((1, block), dtype=np.uint8), t.tensor_type)
        except (NotImplementedError, KeyError, ValueError) as exc:
            raise BadWeights(
                f"{self.path}: tensor {t.name} is of block type {t.tensor_type.name}, which "
                f"corps cannot decode; convert the model to Q4_0, Q4_1, Q8_0 or a K-quant"
            ) from exc

    def _tensor(self, name: str):
        t = self.tensors.get(name)
        if t is None:
            raise BadWeights(
                f"{self.path} has no tensor {name}: the file is not of this model's "
                f"architecture, or is damaged; load the model with weights='dense'"
            )
        return t

    def _row_order(self, name: str, n: int) -> Tensor:
        """Rows of a GGUF tensor in Hugging Face's order: llama.cpp permutes a Llama
        model's q and k rows (each head's halves interleaved) for its RoPE kernel."""
        order = torch.arange(n)
        if self.arch != "llama" or not name.endswith(("attn_q.weight", "attn_k.weight")):
            return order
        heads = self.spec.num_heads if "attn_q" in name else self.spec.num_kv_heads
        half = n // heads // 2
        # row h*D + 2j + r in the file is row h*D + r*half + j in Hugging Face's order
        return order.view(heads, half, 2).transpose(1, 2).reshape(n)
