"""The lone decode step's weights as frozen parameters of one `torch.nn.Module`.

`corps.engine.model.compiled_decode` captures a one-row decode step with torch.compile.
Inductor turns a module's parameters into graph constants when compiled under
`torch._inductor.config.freezing` with gradients off, and only over constants
does it lower a CPU linear to its own prepacked oneDNN (bfloat16, float16) or MKL
(float32) kernels, called from its generated code with no Python per projection.
So the graph reads each projection through a `StepProjection` holding the plain
(N, K) weight of the kernel our eager step uses for one row (`one_row_weight`),
and inductor packs it its own way. One exception: for float32 weights inductor
picks MKL's packed gemm, which on the Zen 4 EPYC of our figures took 34 ms for a
step's one-row products where oneDNN's took 25; so where the eager step's one-row
kernel is `float32-packed`, the graph calls oneDNN on the eager step's own packed
layout (a frozen constant too, so still no Python per projection). The eager
layouts stay where they are: every other step still runs on them.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from corps.engine.model.linear import Linear, TunedLinear, one_row_weight
from corps.engine.model.onednn import packed_product
from corps.engine.model.quantized import Int4Linear, Int8Linear, int4_product, int8_product
from corps.engine.model.weights import Weights


def _frozen(t: Tensor) -> nn.Parameter:
    return nn.Parameter(t, requires_grad=False)  # shares t's storage


class StepProjection(nn.Module):
    """x (M, K) -> (M, N) in x's dtype, through W in the one-row kernel's dtype."""

    def __init__(self, proj: Linear | TunedLinear) -> None:
        super().__init__()
        proj = getattr(proj, "plain", proj)  # an adapter kept apart: its base projection
        # quantized codes: their own packed kernel, called as the eager step calls it, on
        # buffers (named constants of an exported step: `precompiled_decode`)
        self.quant = "int4" if isinstance(proj, Int4Linear) else None
        self.quant = "int8" if isinstance(proj, Int8Linear) else self.quant
        self.packed = False
        if isinstance(proj, Int4Linear):
            self.split = proj.split
            self.register_buffer("codes", proj.packed)
            self.register_buffer("scales", proj.scales_zeros)
        elif isinstance(proj, Int8Linear):
            self.register_buffer("codes", proj.q)
            self.register_buffer("scales", proj.scale)
        if self.quant is not None:
            self.register_buffer("bias", proj.b)
            return
        # oneDNN's float32 layout as it is, else the plain weight inductor packs itself
        self.packed = isinstance(proj, TunedLinear) and proj.kernel_for(1) == "float32-packed"
        w = proj.layouts["float32-packed"] if self.packed else one_row_weight(proj)
        self.weight = _frozen(w)  # (N, K)
        self.bias = None if proj.b is None else _frozen(proj.b)  # (N,)

    def forward(self, x: Tensor) -> Tensor:
        if self.quant == "int4":
            return int4_product(x, self.codes, self.scales, self.split, self.bias)
        if self.quant == "int8":
            return int8_product(x, self.codes, self.scales, self.bias)
        if self.packed:  # the bias inside the op: inductor's linear + add pass would
            return packed_product(x, self.weight, self.bias)  # want W from its own pack
        y = F.linear(x.to(self.weight.dtype), self.weight).to(x.dtype)
        return y if self.bias is None else y + self.bias


class StepLayer(nn.Module):
    """One decoder layer's weights: norms and the four fused projections."""

    def __init__(self, lw) -> None:  # lw: LayerWeights
        super().__init__()
        self.input_norm = _frozen(lw.input_norm)  # (E,)
        self.post_norm = _frozen(lw.post_norm)  # (E,)
        self.q_norm = None if lw.q_norm is None else _frozen(lw.q_norm)  # (D,)
        self.k_norm = None if lw.k_norm is None else _frozen(lw.k_norm)  # (D,)
        self.qkv = StepProjection(lw.qkv)
        self.o = StepProjection(lw.o)
        self.gate_up = StepProjection(lw.gate_up)
        self.down = StepProjection(lw.down)


class StepWeights(nn.Module):
    """Every weight a one-row step reads after the embedding lookup."""

    def __init__(self, w: Weights) -> None:
        super().__init__()
        self.layers = nn.ModuleList(StepLayer(lw) for lw in w.layers)
        self.final_norm = _frozen(w.final_norm)  # (E,)
        self.lm_head = StepProjection(w.lm_head)


def frozen_compile_config(gemms: str = "library"):
    """The inductor settings the step is compiled under: parameters as constants;
    `gemms` "autotune": inductor's own C++ GEMM kernels timed against the library
    kernels for each product shape, the faster kept (`EngineConfig.compile_gemms`)."""
    import torch._inductor.config as inductor

    if gemms == "autotune":
        return inductor.patch(
            freezing=True,
            max_autotune=True,
            max_autotune_gemm_backends="CPP,ATEN",
            autotune_num_choices_displayed=0,  # no timing tables on the user's stderr
            max_autotune_report_choices_stats=False,
        )
    return inductor.patch(freezing=True)
