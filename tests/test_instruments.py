"""engine/exec/instruments.py: counting what the torch thread runs, inside the block only."""

from __future__ import annotations

import torch

from corps.engine.exec.instruments import counting_ops
from corps.engine.exec.torch_thread import TORCH


async def test_counting_sees_the_torch_thread_and_stops_with_the_block():
    x = torch.randn(8)
    async with counting_ops() as c:
        await TORCH.run(lambda: x * 2)
    await TORCH.run(lambda: x * 3)  # after the block: not counted
    assert dict(c.ops) == {"mul": 1}


async def test_the_profiler_sees_the_torch_threads_ops_under_their_phase():
    """Started from the event loop, a profiler missed the torch thread's CPU ops, and
    with them every kernel's phase (the H200 run of 2026-11-28)."""
    from corps.engine.exec.instruments import profiling
    from corps.engine.exec.phases import Account, phase

    x = torch.randn(16, 16)

    def work():
        with Account(labels=True), phase("decode"):
            x @ x

    await TORCH.run(lambda: None)  # the thread runs before the profiler starts
    async with profiling() as prof:
        await TORCH.run(work)
    events = prof.events()
    (mm,) = [e for e in events if e.name == "aten::mm"]
    ancestors = []
    while mm.cpu_parent is not None:
        mm = mm.cpu_parent
        ancestors.append(mm.name)
    assert "corps.decode" in ancestors
