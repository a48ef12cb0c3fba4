"""A lone decode step captured whole by torch.compile (`EngineConfig.compile`).

A one-row step of one call spends a third of its time outside the products: about
70 small eager ops per layer (norms, RoPE, casts, attention), each a few
microseconds of dispatch. Captured as one graph, inductor fuses them into a few
C++ loops around the products, which run over weights frozen into the graph
(`corps.engine.model.decode_module`) through inductor's own packed kernels. Only that
step is captured: one call, one new token, its view read from the view arena in
two parts, either a shared context beside the call's own tokens, or a view that
is one slice (`contiguous`) cut in two before its last `MIN_PART` keys. One graph
serves both: the compile, which dominates opening such an engine, happens once.
Every other step runs eagerly, unchanged.

The graph is pure: it reads the view's keys and values as they are and returns the
new token's keys and values; they are written to the store and the view after it,
in two copies for all layers. The current token's own key is attended as a third
part beside the view's, the parts' softmax merged exactly as `attend_parts` does.

Which kernels run the products is `EngineConfig.compile_gemms` ("library": oneDNN
or MKL; "autotune": inductor's own C++ GEMMs where it times them faster here,
`step_module.frozen_compile_config`). Rounding differs from the eager step
(inductor fuses the norms and casts), so this is off by default and not exact in
float32. Its sizes are symbolic: the graph is
traced on part lengths that differ from each other and from 0 and 1, so no later
length can need another; at run time the guards are skipped
(`skip_guard_eval_unsafe`) because nothing they check can change.
"""

from __future__ import annotations

import time
import types
import warnings
from collections.abc import Callable

import torch
from torch import Tensor

from corps.cache.arena import ViewArena
from corps.cache.kv import KVStore
from corps.engine.errors import InvalidRequest
from corps.engine.model.decode_module import StepWeights, frozen_compile_config
from corps.engine.model.runner import ForwardBatch, ModelRunner, layer_mlp, layer_qkv, rms_norm
from corps.engine.model.weights import Weights

#: The fewest keys a part may have: dynamo would specialise a graph on 0 and 1.
MIN_PART = 2
#: The kinds of view the graph reads, in `CompiledDecode.steps`.
SLICE, SHARED = "slice", "shared"


class CompiledDecode:
    """One-row steps of one call through one captured graph."""

    label = "compile=True"  # the setting that put it there, in warnings

    def __init__(
        self, weights: Weights, store: KVStore, arena: ViewArena, gemms: str = "library"
    ) -> None:
        self.w = weights
        self.gemms = gemms  # EngineConfig.compile_gemms
        self.frozen = StepWeights(weights)  # what the graph reads, folded in as constants
        self.store = store
        self.arena = arena  # views' keys are slices of it: the graph assumes its strides
        self._graph: Callable | None = None  # the compiled forward, once `warm` ran
        self.compile_seconds = 0.0
        self.steps = {SLICE: 0, SHARED: 0}  # steps through the graph, by kind of view
        self.disabled: str | None = None  # why the graph stopped being used, if it did

    def parts(self, batch: ForwardBatch) -> tuple[list[Tensor], list[Tensor], str] | None:
        """The keys and values (L, Hkv, n, D) the step's call reads, in two parts, and
        the kind of view, when the step is a lone one-row step this class serves;
        else None."""
        if self.disabled or len(batch.spans) != 1 or batch.input_ids.shape[0] != 1:
            return None
        if batch.spans[0].adapted or batch.spans[0].at is not None:  # base weights; decodes
            return None
        view = batch.spans[0].view
        if view.contiguous:  # one slice, read as two
            n = view.length
            if n < 2 * MIN_PART:
                return None
            cut = n - MIN_PART
            ks = [view.k[:, :, :cut], view.k[:, :, cut:n]]
            return ks, [view.v[:, :, :cut], view.v[:, :, cut:n]], SLICE
        ctx, m = view.ctx, view.own_length
        if ctx is None or ctx.in_store or ctx.length < MIN_PART or m < MIN_PART:
            return None
        return [ctx.k, view.own_k[:, :, :m]], [ctx.v, view.own_v[:, :, :m]], SHARED

    def forward(
        self, batch: ForwardBatch, ks: list[Tensor], vs: list[Tensor], kind: str
    ) -> Tensor | None:
        """Encode the step's token, write its K/V to the store and the view, return
        the logits of `batch.logit_rows` (N, V); `ks`, `vs`, `kind` are `parts(batch)`.

        None, with nothing written, if the graph refused the inputs (dynamo found
        it would need another graph: an assumption of `warm` broke); the graph
        is then given up, with a warning, and every step runs eagerly."""
        x, cos, sin = self._inputs(batch.input_ids, batch.positions)
        try:
            logits, new = self._run(x, cos, sin, ks, vs)  # (1, V), (L, 3, Hkv, D)
        except RuntimeError as exc:  # a recompile refused: nothing was written
            self.disabled = str(exc).splitlines()[0]
            warnings.warn(
                f"{self.label}: the captured decode step refused a step ({self.disabled}); "
                "decoding eagerly from now on",
                RuntimeWarning,
                stacklevel=2,
            )
            return None
        slot = int(batch.slots[0])
        self.store.k[:, slot] = new[:, 1]  # unrotated key, (L, Hkv, D)
        self.store.v[:, slot] = new[:, 2]
        view = batch.spans[0].view
        m = view.own_length
        view.own_k[:, :, m] = new[:, 0]  # rotated key
        view.own_v[:, :, m] = new[:, 2]
        view.advance(1)
        self.steps[kind] += 1
        return logits if batch.logit_rows.numel() == 1 else logits[batch.logit_rows]  # (N, V)

    def _run(self, x, cos, sin, ks, vs) -> tuple[Tensor, Tensor]:
        """The graph `warm` made, on one step's inputs."""
        with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
            return self._graph(x, cos, sin, ks, vs)

    def warm(self) -> float:
        """Trace and compile the graph now, on throwaway tensors; the seconds it took.
        Part lengths are the only symbolic sizes; they are traced at lengths that
        differ from each other, so the graph assumes nothing about them."""
        t0 = time.perf_counter()
        graph = torch.compile(_own_code(self._eager), fullgraph=True)
        with torch.inference_mode(), frozen_compile_config(self.gemms):  # as `forward`
            x, cos, sin = self._inputs(torch.zeros(1, dtype=torch.long, device=self.w.device))
            ks = [self.arena.k[:, :, :n] for n in (11, 13)]  # read only; (L, Hkv, n, D)
            vs = [self.arena.v[:, :, :n] for n in (11, 13)]
            for p in ks + vs:
                torch._dynamo.mark_dynamic(p, 2)
            graph(x, cos, sin, ks, vs)
        self._graph = graph
        self.compile_seconds += time.perf_counter() - t0
        return self.compile_seconds

    def _inputs(self, ids: Tensor, positions: Tensor | None = None):
        """The token's embedding (1, E) and its RoPE tables (1, 1, D) each."""
        w = self.w
        positions = ids if positions is None else positions
        cos = w.rope.cos[positions].unsqueeze(1)
        return w.embedding(ids), cos, w.rope.sin[positions].unsqueeze(1)

    def _eager(
        self, x: Tensor, cos: Tensor, sin: Tensor, ks: list[Tensor], vs: list[Tensor]
    ) -> tuple[Tensor, Tensor]:
        """The step as one function: logits (1, V) and, per layer, the new token's
        rotated key, key and value stacked (L, 3, Hkv, D)."""
        w, spec = self.frozen, self.w.spec
        hq, hkv, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
        scale = d**-0.5
        new = []
        for i, lw in enumerate(w.layers):
            q, k_rot, k, v = layer_qkv(
                x, lw.input_norm, lw.qkv, lw.q_norm, lw.k_norm, cos, sin, hq, hkv,
                spec.rms_norm_eps,
            )  # fmt: skip
            attn = attend_one(q, k_rot, v, [p[i] for p in ks], [p[i] for p in vs], scale)
            x = layer_mlp(
                x, attn, lw.o, lw.post_norm, lw.gate_up, lw.down, spec.rms_norm_eps
            )  # (1, E)
            new.append(torch.stack([k_rot[0], k[0], v[0]]))  # (3, Hkv, D)
        h = rms_norm(x, w.final_norm, spec.rms_norm_eps)
        return w.lm_head(h), torch.stack(new)


def _own_code(method: Callable) -> Callable:
    """`method` bound to a copy of its function with a code object of its own.

    dynamo keeps compiled graphs on the code object, guarded on types, shapes,
    dtypes and kernel names (not on which engine), and refuses a ninth graph for
    one code object (its recompile limit, 8). Every engine compiles `_eager`, so
    a process that had opened compiled engines of eight models or precisions
    (their graphs kept after they closed) could not open a ninth. With a code
    object of its own, an engine's graphs are its own and die with it."""
    fn = method.__func__
    code = fn.__code__.replace()  # equal, not the same object
    copy = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    return types.MethodType(copy, method.__self__)


def attend_one(
    q: Tensor, k_new: Tensor, v_new: Tensor, ks: list[Tensor], vs: list[Tensor], scale: float
) -> Tensor:
    """One query q (1, Hq, D) over parts of keys and values (Hkv, n_i, D) and its
    own new key and value (1, Hkv, D), all visible; the parts' softmax merged
    exactly (a shared maximum, summed numerators and normalisers). (1, Hq D)."""
    hq, d = q.shape[1:]
    hkv = k_new.shape[1]
    qg = q.view(hkv, hq // hkv, d) * scale  # (Hkv, G, D)
    scores = [torch.bmm(qg, k.transpose(1, 2)) for k in ks]  # (Hkv, G, n_i) each
    own = (qg * k_new.view(hkv, 1, d)).sum(-1, keepdim=True)  # (Hkv, G, 1)
    top = own
    for s in scores:
        top = torch.maximum(top, s.amax(-1, keepdim=True))  # (Hkv, G, 1)
    e_own = torch.exp(own - top)
    num, den = e_own * v_new.view(hkv, 1, d), e_own  # (Hkv, G, D), (Hkv, G, 1)
    for s, v in zip(scores, vs, strict=True):
        e = torch.exp(s - top)
        num = num + torch.bmm(e, v)
        den = den + e.sum(-1, keepdim=True)
    return (num / den).reshape(1, hq * d)


def compile_step(runner: ModelRunner, arena: ViewArena, gemms: str = "library") -> None:
    """Capture the runner's lone one-row decode step (`EngineConfig.compile`): it needs
    the torch attention backend (and contexts "copy", which the caller checks)."""
    if runner.attention.name != "torch":
        raise InvalidRequest(
            "compile=True needs the torch attention backend and contexts='copy' "
            f"(this engine has {runner.attention.name!r})"
        )
    compiled = CompiledDecode(runner.w, runner.store, arena, gemms=gemms)
    compiled.warm()
    runner.compiled = compiled
