"""Counting the torch ops engine work runs: a proxy, measurable on a CPU, for the
kernels a GPU would launch for it (a launch-bound step's cost is its launches).

`counting_ops()` pushes a torch-function mode on the torch thread (`TORCH`), where
every engine of the process steps, for as long as its block lasts: every torch call
any engine makes meanwhile is seen at the level the engine makes it (`F.linear` is
one call, as it is one GEMM on a GPU; FlexAttention one, as its one compiled
kernel). A call counts as a kernel (`OpCounts.kernels`, by name in `ops`) when it
computes: it returns a tensor that is not a view of its first argument, or it works
in place (`add_`, `index_copy_`, `__setitem__`). Views, metadata (`.shape`,
`.size()`) and no-op casts are not counted; calls that bring a value to the host
(`item`, `tolist`) are counted apart (`syncs`): on a GPU each waits for the device.
Counting slows the work it sees; time nothing under it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from torch import Tensor
from torch.overrides import TorchFunctionMode

from corps.engine.exec.torch_thread import TORCH

#: calls that copy a value to the host (a device sync on a GPU)
SYNCS = frozenset({"item", "tolist", "__bool__", "__int__", "__float__", "__index__"})


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
        out = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", str(func))
        if name in SYNCS:
            self.syncs[name] += 1
        elif _computes(name, args, out):
            self.ops[name] += 1
        return out

    @property
    def kernels(self) -> int:
        return sum(self.ops.values())


@asynccontextmanager
async def counting_ops() -> AsyncIterator[OpCounts]:
    """Count the torch calls the torch thread makes inside the block."""
    counts = OpCounts()
    await TORCH.run(counts.__enter__)
    try:
        yield counts
    finally:
        await TORCH.run(counts.__exit__, None, None, None)
