"""Counting the torch calls every engine of the process makes while a block runs
(`corps.engine.kernels.op_count`), on the torch thread where they all step
(`TORCH`). Counting slows the work it sees; time nothing under it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

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
