"""The lone decode step compiled ahead of time, once per machine (`EngineConfig.precompiled`).

`compiled_decode` captures a one-call one-row decode step with torch.compile each
time an engine opens (20-30 s for SmolLM2-135M on a 2-core CPU). Here the same
step function is compiled ahead of time with AOTInductor (`torch.export`, then
`aoti_compile_and_package`) into a package kept under `$CORPS_HOME/steps`: built
once per machine and shape of model (about a minute), loaded by every engine
after in a tenth of a second.

The package holds code, not weights. Its constants are the step module's own
tensors (`decode_module.StepWeights`: norms as parameters, quantized codes and
scales as buffers), handed to it by pointer when it is loaded (`user_managed`):
it costs no memory beside the weights, and one package serves any weights of the
same shapes. The only constants inductor adds of its own are the int4 kernel's
group size, one per product, recorded beside the package at build time (a
build checks its package against the eager step function before keeping it).

What the package is keyed on (`step_key`): this module's format, torch's
version, the CPU (its model name and the vector ISA inductor compiles for), the
model's shape and the name, shape, dtype and strides of every constant, and the
view arena's strides (the graph reads views' keys as slices of it). Anything
else that changes invalidates nothing it depends on.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
import warnings
from pathlib import Path

import torch
from torch import Tensor, nn

from corps.cache.arena import ViewArena
from corps.cache.kv import KVStore
from corps.engine.model.compiled_decode import CompiledDecode
from corps.engine.model.quantized import GROUP, Int4Linear, Int8Linear
from corps.engine.model.weights import Weights

#: Bumped whenever the step function or `StepWeights` change what a package computes.
STEP_FORMAT = 1
#: The part lengths a package is exported at (any length >= 2 runs through it).
EXAMPLE_PARTS = (11, 13)


class BuildFailed(RuntimeError):
    """A package could not be built or did not match the eager step function."""


class _Exported(nn.Module):
    """What torch.export sees: the step's weights as submodule `w`, its function as
    forward."""

    def __init__(self, step: CompiledDecode) -> None:
        super().__init__()
        self.w = step.frozen
        self._step = step

    def forward(self, x, cos, sin, ks, vs):
        return self._step._eager(x, cos, sin, ks, vs)


def applies(w: Weights, attention: str, device: str) -> bool:
    """Whether a precompiled step serves an engine: quantized weights on a CPU with
    the torch attention backend (dense weights keep their tuned eager kernels)."""
    quantized = any(isinstance(p, (Int4Linear, Int8Linear)) for p in w.projections)
    return quantized and device.startswith("cpu") and attention == "torch"


def step_key(step: CompiledDecode) -> str:
    """The package's name: a digest of everything the compiled code depends on."""
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    consts = {n: t for n, t in _Exported(step).state_dict(keep_vars=True).items()}
    arena = step.arena.k
    facts = {
        "format": STEP_FORMAT,
        "torch": torch.__version__,
        "cpu": _cpu_name(),
        "isa": str(pick_vec_isa()),
        "spec": repr(step.w.spec),
        "dtype": str(step.w.dtype),
        "arena": [list(arena.shape), list(arena.stride()), str(arena.dtype)],
        "constants": [
            [n, list(t.shape), list(t.stride()), str(t.dtype)] for n, t in sorted(consts.items())
        ],
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:24]


def _cpu_name() -> str:
    """The CPU's model name and its flags (a VM's model name alone, "AMD EPYC", can be
    any generation: the flags say which instructions compiled code may use)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    wanted = [next((ln for ln in lines if ln.startswith(k)), "") for k in ("model name", "flags")]
    return " | ".join(wanted)


class PrecompiledDecode(CompiledDecode):
    """`CompiledDecode` whose graph is a package compiled ahead of time."""

    label = "precompiled"

    def __init__(self, weights: Weights, store: KVStore, arena: ViewArena) -> None:
        super().__init__(weights, store, arena)
        self.key = step_key(self)
        self._runner = None
        # the longest part the graph reads: one short of the arena (a slice of all of
        # it is another case to torch.export), longer parts decode eagerly
        self.max_part = arena.k.shape[2] - 1

    def parts(self, batch):
        got = super().parts(batch)
        if got is None or max(k.shape[2] for k in got[0]) > self.max_part:
            return None
        return got

    def package(self, cache: Path) -> Path:
        return cache / f"{self.key}.pt2"

    def load(self, cache: Path) -> bool:
        """Load this step's package from `cache` with the live weights as its
        constants; False when there is none (or it cannot be read: a warning)."""
        path = self.package(cache)
        if not path.is_file():
            return False
        t0 = time.perf_counter()
        try:
            extra = json.loads(path.with_suffix(".json").read_text())["extra"]
            runner = torch._inductor.aoti_load_package(str(path))
            runner.load_constants(
                self._constants(runner.get_constant_fqns(), extra),
                check_full_update=True,
                user_managed=True,
            )
        except Exception as exc:  # a package from a failed or foreign write: decode eagerly
            warnings.warn(
                f"the precompiled decode step {path} cannot be loaded "
                f"({type(exc).__name__}); decoding eagerly (with precompiled='auto' it is "
                "built again once this process exits)",
                RuntimeWarning,
                stacklevel=2,
            )
            return False
        self._runner = runner
        self.compile_seconds += time.perf_counter() - t0
        return True

    def _constants(self, fqns: list[str], extra: dict[str, int]) -> dict[str, Tensor]:
        """The package's constants by name: the step module's tensors, and each extra
        constant inductor made (a kernel's group size) as a 0-d int64 tensor."""
        own = _Exported(self).state_dict(keep_vars=True)
        self._extra = {n: torch.tensor(v, dtype=torch.int64) for n, v in extra.items()}
        missing = [n for n in fqns if n not in own and n not in self._extra]
        if missing:
            raise BuildFailed(f"{len(missing)} constants of the package are unknown")
        return {n: (own[n] if n in own else self._extra[n]).detach() for n in fqns}

    def _run(self, x, cos, sin, ks, vs) -> tuple[Tensor, Tensor]:
        return self._runner(x, cos, sin, ks, vs)

    def build(self, cache: Path) -> Path:
        """Export and compile the step into `cache` (about a minute for SmolLM2-135M
        on 2 cores), check it against the eager step function, then load it. The
        package appears whole or not at all (written aside, then renamed)."""
        t0 = time.perf_counter()
        cache.mkdir(parents=True, exist_ok=True)
        path = self.package(cache)
        tmp = path.with_name(f".{path.stem}.{os.getpid()}.pt2")
        module = _Exported(self)
        args = self._example()
        n0 = torch.export.Dim("context", min=2, max=self.max_part)
        n1 = torch.export.Dim("own", min=2, max=self.max_part)
        shapes = (None, None, None, [{2: n0}, {2: n1}], [{2: n0}, {2: n1}])
        try:
            with torch.inference_mode(), warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # torch's own deprecations
                program = torch.export.export(module, args, dynamic_shapes=shapes)
            torch._inductor.aoti_compile_and_package(
                program,
                package_path=str(tmp),
                inductor_configs={"aot_inductor.package_constants_in_so": False},
            )
            runner = torch._inductor.aoti_load_package(str(tmp))
            own = module.state_dict(keep_vars=True)
            extra = {n: GROUP for n in runner.get_constant_fqns() if n not in own}
            runner.load_constants(
                self._constants(runner.get_constant_fqns(), extra),
                check_full_update=True,
                user_managed=True,
            )
            self._check(runner, module)
            path.with_suffix(".json").write_text(json.dumps({"extra": extra}))
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        self._runner = runner
        self.compile_seconds += time.perf_counter() - t0
        return path

    def _example(self) -> tuple:
        """Throwaway inputs of the step: a token and parts cut from the arena."""
        x, cos, sin = self._inputs(torch.zeros(1, dtype=torch.long, device=self.w.device))
        ks = [self.arena.k[:, :, :n] for n in EXAMPLE_PARTS]  # (L, Hkv, n, D) slices
        vs = [self.arena.v[:, :, :n] for n in EXAMPLE_PARTS]
        return x, cos, sin, ks, vs

    def _check(self, runner, module: nn.Module) -> None:
        """The package against the eager step function on random keys and values
        at part lengths other than the example's."""
        gen = torch.Generator().manual_seed(0)
        k, v = self.arena.k, self.arena.v
        n = min(40, self.max_part)  # the arena's first n keys and values, put back after
        saved = k[:, :, :n].clone(), v[:, :, :n].clone()
        try:
            k[:, :, :n] = torch.randn(saved[0].shape, generator=gen).to(k.dtype)
            v[:, :, :n] = torch.randn(saved[1].shape, generator=gen).to(v.dtype)
            x, cos, sin, _, _ = self._example()
            with torch.inference_mode():
                for a, b in ((2, 2), (7, n - 7)) if n >= 9 else ((2, 2),):
                    ks, vs = [k[:, :, :a], k[:, :, a : a + b]], [v[:, :, :a], v[:, :, a : a + b]]
                    want, got = module(x, cos, sin, ks, vs), runner(x, cos, sin, ks, vs)
                    for w, g in zip(want, got, strict=True):
                        if not torch.allclose(w.float(), g.float(), rtol=1e-2, atol=1e-2):
                            raise BuildFailed(
                                "the compiled step does not match the eager one "
                                f"(largest difference {(w.float() - g.float()).abs().max():.3g})"
                            )
        finally:
            k[:, :, :n], v[:, :, :n] = saved


def precompiled_step(runner, arena: ViewArena, cache: Path, build: bool = False) -> Path | None:
    """Give the runner's lone one-row decode step its package from `cache` where one
    applies (`applies`); build it first if `build`. The package's path when one
    applies but none is kept (a caller may build it elsewhere), else None."""
    if not applies(runner.w, runner.attention.name, str(runner.w.device)):
        return None
    step = PrecompiledDecode(runner.w, runner.store, arena)
    if not step.load(cache):
        if not build:
            return step.package(cache)
        step.build(cache)
    runner.compiled = step
    return None
