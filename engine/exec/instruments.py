"""Instruments over what every engine of the process runs while a block runs, each
entered and left on the torch thread where they all step (`TORCH`): the torch
calls counted (`corps.engine.kernels.op_count`), the per-phase account, the
profiler. Counting slows the work it sees; time nothing under it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, AbstractContextManager, asynccontextmanager
from typing import TypeVar

import torch

from corps.engine.exec.phases import Account
from corps.engine.exec.torch_thread import TORCH
from corps.engine.kernels.op_count import OpCounts

C = TypeVar("C", bound=AbstractContextManager)


@asynccontextmanager
async def _on_torch_thread(instrument: C) -> AsyncIterator[C]:
    """`instrument` entered on the torch thread for the block, and left there."""
    await TORCH.run(instrument.__enter__)
    try:
        yield instrument
    finally:
        await TORCH.run(instrument.__exit__, None, None, None)


def counting_ops() -> AbstractAsyncContextManager[OpCounts]:
    """Count the torch calls the torch thread makes inside the block."""
    return _on_torch_thread(OpCounts())


def accounting(
    device: str = "cpu", *, count_ops: bool = False, labels: bool = False
) -> AbstractAsyncContextManager[Account]:
    """The per-phase account (`corps.engine.exec.phases.Account`) of what the torch
    thread runs inside the block."""
    return _on_torch_thread(Account(device, count_ops=count_ops, labels=labels))


def profiling(cuda: bool = False) -> AbstractAsyncContextManager[torch.profiler.profile]:
    """torch.profiler over what the torch thread runs inside the block (CPU ops, and
    CUDA kernels with `cuda`). Started on that thread: a profiler started on the
    event loop's thread does not see the CPU ops of a thread that was already running
    (the H200 run of 2026-11-28 got no per-phase kernels for that)."""
    acts = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return _on_torch_thread(torch.profiler.profile(activities=acts))
