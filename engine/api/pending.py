"""`Pending`: a call queued with a `_nowait` method, awaited later."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import Any

from corps.cache.handle import Handle, bind
from corps.engine.sched.job import Job


class Pending:
    """A queued call: `await pending` for its handle; cancelling the await cancels it."""

    def __init__(
        self,
        job: Job | Awaitable[Job],
        run: Callable[[Job], Awaitable[Handle]],
        wait: Callable[[Job], Awaitable[Handle]],
    ) -> None:
        self._job = job
        self._run = run  # queues a deferred job and waits for it (`Submitter.run`)
        self._wait_for = wait  # waits for a queued job (`Scheduler.wait`)
        self._cancelled = False

    def __await__(self) -> Generator[Any, None, Handle]:
        return self._wait().__await__()

    async def _wait(self) -> Handle:
        job = self._job
        if not isinstance(job, Job):  # deferred: re-encode, then queue
            job = self._job = await job
            job.cancelled = self._cancelled
            return await self._run(job)
        return bind(await self._wait_for(job), job.request.owner)

    def cancel(self) -> None:
        self._cancelled = True
        if isinstance(self._job, Job):
            self._job.cancelled = True
