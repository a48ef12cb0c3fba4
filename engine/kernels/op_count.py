"""Counting the torch calls some work makes: a proxy, measurable on a CPU, for the
kernels a GPU would launch for it (a launch-bound step's cost is its launches).

`OpCounts` is a torch-function mode: under it every torch call is seen at the level
the caller makes it (`F.linear` is one call, as it is one GEMM on a GPU).
FlexAttention, which eager mode runs inside a compiled wrapper the mode does not
see, reports itself once per launch (`count_kernel`), as its one compiled kernel on
a GPU; what dynamo traces while the mode is on (a compile on CUDA) is not counted
(the H200 run of 2026-11-28 failed every FlexAttention compile under the counter
before this). A call counts as a kernel (`OpCounts.kernels`, by name in `ops`) when it
computes: it returns a tensor that is not a view of its first argument, or it works
in place (`add_`, `index_copy_`, `__setitem__`). Views, metadata (`.shape`,
`.size()`) and no-op casts are not counted; calls that bring a value to the host
(`item`, `tolist`) are counted apart (`syncs`): on a GPU each waits for the device.
Counting slows the work it sees; time nothing under it.
`corps.engine.exec.instruments.counting_ops` counts what the engines run on their
thread.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

#: calls that copy a value to the host (a device sync on a GPU)
SYNCS = frozenset({"item", "tolist", "__bool__", "__int__", "__float__", "__index__"})


#: the counters active on each thread, innermost last
_ACTIVE = threading.local()


def _active() -> list[OpCounts]:
    if not hasattr(_ACTIVE, "counts"):
        _ACTIVE.counts = []
    return _ACTIVE.counts


def count_kernel(name: str) -> None:
    """One launch of `name`, for the counters active on this thread (for calls the
    mode cannot see); nothing when none is."""
    for counts in _active():
        counts.count(name)


def _storage(x: Any) -> int | None:
    return x.untyped_storage().data_ptr() if isinstance(x, Tensor) else None


def _computes(name: str, args: tuple, out: Any) -> bool:
    """Whether a call that returned `out` launched a kernel (see the module doc)."""
    if name == "__setitem__" or (name.endswith("_") and not name.startswith("_")):
        return True  # in place
    if not isinstance(out, Tensor):
        return False  # metadata, or a tuple of views (split, chunk, unbind)
    first = next((a for a in args if isinstance(a, Tensor)), None)
    try:
        return first is None or _storage(out) != _storage(first)
    except (NotImplementedError, RuntimeError):  # no storage (inside vmap): computes
        return True


class OpCounts(TorchFunctionMode):
    """The kernels (`ops`, by name) and host syncs (`syncs`) of the calls made under
    this mode (see the module doc for what counts)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.syncs: Counter[str] = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None) -> Any:
        if torch.compiler.is_compiling():  # traced into a compiled graph: not a launch
            return func(*args, **(kwargs or {}))
        out = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", str(func))
        if name in SYNCS:
            self.syncs[name] += 1
        elif _computes(name, args, out):
            self.ops[name] += 1
        return out

    def count(self, name: str) -> None:
        """One launch of `name` the mode cannot see (`count_kernel`)."""
        self.ops[name] += 1

    def __enter__(self) -> OpCounts:
        _active().append(self)
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        _active().remove(self)
        super().__exit__(*exc)

    @property
    def kernels(self) -> int:
        return sum(self.ops.values())
