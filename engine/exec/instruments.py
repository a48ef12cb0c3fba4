"""Counting the torch calls every engine of the process makes while a block runs
(`corps.engine.kernels.op_count`), on the torch thread where they all step
(`TORCH`), and the per-phase account of that work. Counting slows the work it
sees; time nothing under it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import torch

from corps.engine.exec.phases import Account
from corps.engine.exec.torch_thread import TORCH
from corps.engine.kernels.op_count import OpCounts


@asynccontextmanager
async def counting_ops() -> AsyncIterator[OpCounts]:
    """Count the torch calls the torch thread makes inside the block."""
    counts = OpCounts()
    await TORCH.run(counts.__enter__)
    try:
        yield counts
    finally:
        await TORCH.run(counts.__exit__, None, None, None)


@asynccontextmanager
async def accounting(
    device: str = "cpu", *, count_ops: bool = False, labels: bool = False
) -> AsyncIterator[Account]:
    """The per-phase account (`corps.engine.exec.phases.Account`) of what the torch
    thread runs inside the block."""
    account = Account(device, count_ops=count_ops, labels=labels)
    await TORCH.run(account.__enter__)
    try:
        yield account
    finally:
        await TORCH.run(account.__exit__, None, None, None)


@asynccontextmanager
async def profiling(cuda: bool = False) -> AsyncIterator[torch.profiler.profile]:
    """torch.profiler over what the torch thread runs inside the block (CPU ops, and
    CUDA kernels with `cuda`). Started on that thread: a profiler started on the
    event loop's thread does not see the CPU ops of a thread that was already running
    (the H200 run of 2026-11-28 got no per-phase kernels for that)."""
    acts = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    prof = torch.profiler.profile(activities=acts)
    await TORCH.run(prof.__enter__)
    try:
        yield prof
    finally:
        await TORCH.run(prof.__exit__, None, None, None)
