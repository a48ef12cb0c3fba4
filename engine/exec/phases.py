"""Where an engine's time goes, phase by phase: the per-phase account of a workflow.

The executor marks its work with `phase(name)` regions (nested regions count for
the innermost one):

- admit: planning a call and reserving its slots (the host's part of admission);
- placement: building a call's view, its parents' encodings gathered and re-rotated
  to the positions it reads them at;
- prefill / decode / mixed / recompute: a step's forward, by what its rows are: new
  text only, sampled tokens only, both, or any repair rows (context recomputed);
- probe: a repair's probe (the pass that picks which context rows to recompute);
- masks: constraint masks applied to a step's logits (their wait included);
- sample: scoring, the draw, and each call moved on by its rows;
- finish: a done call's message registered.

What is outside every region (the event loop, the scheduler, the thread hops, the
workflow's own code between calls) is the wall time less the regions' sum.

`Account` holds one run's figures: per phase its entries, host seconds, and, on
CUDA, device seconds (CUDA events at every region boundary: a segment of the
stream's timeline belongs to the phase open when it began, so phases are
exclusive; read once at the end, no sync in between); optionally the kernel
launches (`count_ops`: the torch calls that launch kernels, counted as
`corps.engine.kernels.op_count` counts them: a proxy measurable on a CPU; slows
the work, time nothing under it) and `torch.profiler.record_function` labels
(`labels`: "corps.PHASE", for a profiler's per-phase kernel count on a GPU,
`kernels_by_phase`). With no account open, `phase` costs a thread-local lookup.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch

from corps.engine.kernels.op_count import OpCounts

#: the phases, in the order a call meets them
PHASES = (
    "admit", "placement", "prefill", "decode", "mixed", "recompute", "probe", "masks",
    "sample", "finish",
)  # fmt: skip

#: the profiler label of a phase's region
LABEL = "corps."

_OPEN = threading.local()  # the account open on this thread, if any


class Account(OpCounts):
    """One run's per-phase figures (see the module doc). Open it on the thread whose
    work it accounts (`with account:`; `corps.engine.exec.instruments.accounting` opens
    one on the torch thread)."""

    def __init__(self, device: torch.device | str = "cpu", *, count_ops: bool = False,
                 labels: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.device = torch.device(device)
        self.count_ops, self.labels = count_ops, labels
        self.entries: Counter[str] = Counter()
        self.host_s: Counter[str] = Counter()
        self.launches: Counter[str] = Counter()  # per phase (with count_ops)
        self._stack: list[str] = []
        self._t = 0.0
        self._marks: list[tuple[str | None, Any]] = []  # (phase after, CUDA event)
        self._device_s: Counter[str] | None = None

    # ---- regions ----

    def enter(self, name: str) -> None:
        self._boundary()
        self._stack.append(name)
        self.entries[name] += 1
        self._mark()

    def leave(self) -> None:
        self._boundary()
        self._stack.pop()
        self._mark()

    def _boundary(self) -> None:
        now = time.perf_counter()
        if self._stack:
            self.host_s[self._stack[-1]] += now - self._t
        self._t = now

    def _mark(self) -> None:
        if self.device.type == "cuda":
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self._marks.append((self._stack[-1] if self._stack else None, ev))

    @property
    def device_s(self) -> Counter[str]:
        """Device seconds per phase (CUDA; empty elsewhere). Waits for the device once."""
        if self._device_s is None:
            out: Counter[str] = Counter()
            if self._marks:
                self._marks[-1][1].synchronize()
            for (name, a), (_, b) in itertools.pairwise(self._marks):
                if name is not None:
                    out[name] += a.elapsed_time(b) / 1000
            self._device_s = out
        return self._device_s

    # ---- launches (count_ops) ----

    def __torch_function__(self, func, types, args=(), kwargs=None) -> Any:
        if not self.count_ops or torch.compiler.is_compiling():
            return func(*args, **(kwargs or {}))
        kernels = self.kernels
        out = super().__torch_function__(func, types, args, kwargs)
        if self.kernels != kernels:
            self.launches[self._stack[-1] if self._stack else "outside"] += 1
        return out

    def count(self, name: str) -> None:
        """A launch the mode cannot see (`count_kernel`)."""
        if self.count_ops:
            self.ops[name] += 1
            self.launches[self._stack[-1] if self._stack else "outside"] += 1

    # ---- opening ----

    def __enter__(self) -> Account:
        if getattr(_OPEN, "account", None) is not None:
            raise RuntimeError("an account is already open on this thread")
        _OPEN.account = self
        if self.count_ops:
            super().__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        _OPEN.account = None
        if self.count_ops:
            super().__exit__(*exc)


def open_account() -> Account | None:
    """The account open on this thread, if any."""
    return getattr(_OPEN, "account", None)


@contextmanager
def _region(account: Account, name: str) -> Iterator[None]:
    label = torch.profiler.record_function(LABEL + name) if account.labels else nullcontext()
    account.enter(name)
    try:
        with label:
            yield
    finally:
        account.leave()


_NONE = nullcontext()


def phase(name: str):
    """The region of `name` for the account open on this thread; nothing without one."""
    account = getattr(_OPEN, "account", None)
    return _NONE if account is None else _region(account, name)


def step_phase(decodes: int, chunks: int, repairs: int) -> str:
    """The phase of a step's forward from its rows' kinds: any repair rows make it a
    recompute; else new text only a prefill, sampled tokens only a decode, both mixed."""
    if repairs:
        return "recompute"
    if decodes and chunks:
        return "mixed"
    return "decode" if decodes else "prefill"


def kernels_by_phase(events) -> Counter[str]:
    """Device kernels per phase in a profiler's events (`prof.events()` of a run with
    `labels`): each "corps.PHASE" range's kernels, its nested ranges' excluded (they
    count for their own phase)."""
    out: Counter[str] = Counter()

    def walk(evt, name: str | None) -> None:
        if evt.name.startswith(LABEL) and evt.name[len(LABEL) :] in PHASES:
            name = evt.name[len(LABEL) :]
        if name is not None:
            out[name] += len(evt.kernels)
        for child in evt.cpu_children:
            walk(child, name)

    for evt in events:
        if evt.cpu_parent is None and evt.device_type == torch.autograd.DeviceType.CPU:
            walk(evt, None)
    return out
