"""engine/exec/counting.py: counting what the torch thread runs, inside the block only."""

from __future__ import annotations

import torch

from corps.engine.exec.counting import counting_ops
from corps.engine.exec.torch_thread import TORCH


async def test_counting_sees_the_torch_thread_and_stops_with_the_block():
    x = torch.randn(8)
    async with counting_ops() as c:
        await TORCH.run(lambda: x * 2)
    await TORCH.run(lambda: x * 3)  # after the block: not counted
    assert dict(c.ops) == {"mul": 1}
