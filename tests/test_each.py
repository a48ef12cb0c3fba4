"""One workflow per input (corps.patterns.cluster.each): bounded, and a failure stays its own."""

from __future__ import annotations

import anyio
import anyio.lowlevel

from corps.patterns.cluster.each import each


async def test_every_index_runs_at_most_n_at_once_and_failures_are_reported():
    running, peak, done, seen = 0, 0, [], []

    async def one(i: int) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await anyio.lowlevel.checkpoint()
        running -= 1
        seen.append(i)
        if i % 3 == 0:
            raise ValueError(f"bad {i}")

    failed = await each(range(7), one, concurrency=2, on_done=lambda: done.append(1))
    assert sorted(seen) == list(range(7)) and len(done) == 7 and peak <= 2
    assert failed == {0: "ValueError: bad 0", 3: "ValueError: bad 3", 6: "ValueError: bad 6"}
