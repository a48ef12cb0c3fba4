"""Running one workflow per input line, a few at a time, losing none to another's failure."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

import anyio


async def each(
    indices: Iterable[int],
    one: Callable[[int], Awaitable[None]],
    *,
    concurrency: int,
    on_done: Callable[[], None] | None = None,
) -> dict[int, str]:
    """Await `one(i)` for every index, at most `concurrency` at once; `on_done()` after
    each, whatever happened. Returns the indices whose `one` raised, with why
    ("TypeError: ..."): one input failing does not stop the others."""
    limiter = anyio.CapacityLimiter(concurrency)
    failed: dict[int, str] = {}

    async def run(i: int) -> None:
        async with limiter:
            try:
                await one(i)
            except Exception as exc:
                failed[i] = f"{type(exc).__name__}: {exc}"
        if on_done is not None:
            on_done()

    async with anyio.create_task_group() as tg:
        for i in indices:
            tg.start_soon(run, i)
    return dict(sorted(failed.items()))
