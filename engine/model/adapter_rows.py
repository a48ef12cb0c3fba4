"""An adapter kept apart from the weights, applied to some rows of a step only.

An adapter of scope "rewired" (`corps.engine.model.adapter_files`) is for the calls whose
context choreography rewired (`corps.cache.rewired`): a step may hold rows of such
calls beside rows of chain calls, which must run the base model exactly. So it is
not merged: each adapted projection becomes a `GatedLoRA`, the base projection
(any kernel, untouched) plus the adapter's low-rank product, added to the rows the
step's `RowGate` names (the runner sets them from the step's spans). The product
runs in float32 whatever the weights' precision; its cost is two thin matmuls
over the adapted rows, which is not small on a small model: at rank 64 the
factors of SmolLM2-135M are 13% of its parameters, and a rewired call decoded at
0.55x the base model's speed (docs/benchmarks.md).

The fused projections (q, k, v stacked; gate and up stacked) take their members'
factors stacked: A (sum of ranks, K) and B (N, sum of ranks), block-diagonal with
each member's B (scaling folded in) in its output rows; a member without adapter
weights gets no block.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

#: Each fused projection of ours and the Hugging Face modules it stacks, in order.
FUSED = {
    "qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "o": ("self_attn.o_proj",),
    "gate_up": ("mlp.gate_proj", "mlp.up_proj"),
    "down": ("mlp.down_proj",),
}


class RowGate:
    """The rows (R,) of the step being run that the adapter applies to, or None;
    `every`: they are all of the step's rows (no gather or scatter needed)."""

    def __init__(self) -> None:
        self.rows: Tensor | None = None
        self.every = False

    def set(self, rows: Tensor | None, total: int) -> None:
        self.rows = rows
        self.every = rows is not None and rows.numel() == total


@dataclasses.dataclass(frozen=True)
class Factors:
    """One HF module's adapter: y += (x @ a.T) @ b.T, scaling folded into b."""

    a: Tensor  # (r, K) float32
    b: Tensor  # (N, r) float32


class GatedLoRA:
    """`base` (a projection: x (M, K) -> (M, N)) plus a low-rank delta on the gate's rows;
    `merged`: base + b @ a as one projection, for steps whose rows are all adapted."""

    def __init__(self, base, a: Tensor, b: Tensor, gate: RowGate, merged=None) -> None:
        self.plain = base  # the projection as the base model has it
        self.a = a  # (R, K) float32
        self.b = b  # (N, R) float32
        self.gate = gate
        self.merged = merged

    def __call__(self, x: Tensor) -> Tensor:
        rows = self.gate.rows
        if self.gate.every and self.merged is not None:  # every row: the merged weights
            return self.merged(x)
        y = self.plain(x)  # (M, N)
        if rows is None:
            return y
        if self.gate.every:  # every row: no gather, one fused multiply-add
            low = x.to(self.a.dtype) @ self.a.T  # (M, R)
            return torch.addmm(y.to(self.b.dtype), low, self.b.T).to(y.dtype)
        delta = (x.index_select(0, rows).to(self.a.dtype) @ self.a.T) @ self.b.T  # (R, N)
        return y.index_add(0, rows, delta.to(y.dtype))

    @property
    def weight_bytes(self) -> int:
        extra = sum(t.numel() * t.element_size() for t in (self.a, self.b))
        copy = 0 if self.merged is None else self.merged.weight_bytes
        return self.plain.weight_bytes + extra + copy

    def __getattr__(self, name: str):  # in_features, b, layouts, ... of the base
        if name == "plain" or name.startswith("__"):  # not set yet (copy, pickle)
            raise AttributeError(name)
        return getattr(self.plain, name)


def stacked(members: Sequence[Factors | None], sizes: Sequence[int]) -> tuple[Tensor, Tensor]:
    """A (sum r, K) and block-diagonal B (sum N, sum r) of a fused projection whose
    members have output sizes `sizes` (a member None: no adapter there)."""
    present = [(i, f) for i, f in enumerate(members) if f is not None]
    ranks = [f.a.shape[0] for _, f in present]
    a = torch.cat([f.a for _, f in present])  # (R, K)
    b = torch.zeros(sum(sizes), sum(ranks), dtype=a.dtype, device=a.device)  # (N, R)
    col = 0
    for (i, f), r in zip(present, ranks, strict=True):
        row = sum(sizes[:i])
        b[row : row + sizes[i], col : col + r] = f.b
        col += r
    return a, b


def gated(weights, factors: Mapping[str, Factors], merged=None):
    """`weights` (corps.engine.model.weights.Weights) with every projection the adapter
    touches wrapped in a `GatedLoRA` over one shared `RowGate` (`weights.lora`).
    `factors` by HF module name ("model.layers.3.self_attn.q_proj"); `merged`: the
    same model's Weights with the adapter merged in, whose projections the
    `GatedLoRA`s use for steps of adapted rows only (None: the low-rank product)."""
    gate = RowGate()
    layers = []
    for i, lw in enumerate(weights.layers):
        copy = None if merged is None else merged.layers[i]
        changes = {}
        for ours, modules in FUSED.items():
            members = [factors.get(f"model.layers.{i}.{m}") for m in modules]
            if all(f is None for f in members):
                continue
            sizes = [_out_size(f, m, weights.spec) for f, m in zip(members, modules, strict=True)]
            a, b = stacked(members, sizes)
            device = weights.device
            whole = None if copy is None else getattr(copy, ours)
            changes[ours] = GatedLoRA(getattr(lw, ours), a.to(device), b.to(device), gate, whole)
        layers.append(dataclasses.replace(lw, **changes))
    return dataclasses.replace(weights, layers=tuple(layers), lora=gate)


def _out_size(f: Factors | None, module: str, spec) -> int:
    """A member's output features (from its factors, or the model's spec)."""
    if f is not None:
        return f.b.shape[0]
    d = spec.head_dim
    return {
        "self_attn.q_proj": spec.num_heads * d,
        "self_attn.k_proj": spec.num_kv_heads * d,
        "self_attn.v_proj": spec.num_kv_heads * d,
        "mlp.gate_proj": spec.intermediate_size,
        "mlp.up_proj": spec.intermediate_size,
    }[module]


def merge_into(hf, factors: Mapping[str, Factors]):
    """A copy of `hf` (a float32 transformers model) with every module's weight
    plus its factors' product b @ a."""
    import copy

    out = copy.deepcopy(hf)
    with torch.no_grad():
        for name, f in factors.items():
            weight = out.get_submodule(name).weight  # (N, K)
            weight += (f.b @ f.a).to(weight.dtype)
    return out


def factors_of(peft_model) -> dict[str, Factors]:
    """Every LoRA layer's factors of a loaded peft model (adapter "default"), by the
    HF model's module name, scaling folded into B; in float32."""
    out = {}
    for name, module in peft_model.base_model.model.named_modules():
        a = getattr(module, "lora_A", None)
        if a is None or "default" not in a:
            continue
        scale = module.scaling["default"]
        out[name] = Factors(
            a["default"].weight.detach().float().clone(),
            (module.lora_B["default"].weight.detach().float() * scale).clone(),
        )
    return out
