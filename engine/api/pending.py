"""`Pending`: a call queued with a `_nowait` method, awaited later."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import Any

from corps.cache.handle import Handle, bind
from corps.engine.exec.call import Call


class Pending:
    """A queued call: `await pending` for its handle; cancelling the await cancels it."""

    def __init__(
        self,
        call: Call | Awaitable[Call],
        run: Callable[[Call], Awaitable[Handle]],
        wait: Callable[[Call], Awaitable[Handle]],
    ) -> None:
        self._call = call
        self._run = run  # queues a deferred call and waits for it (`Submitter.run`)
        self._wait_for = wait  # waits for a queued call (`Scheduler.wait`)
        self._cancelled = False

    def __await__(self) -> Generator[Any, None, Handle]:
        return self._wait().__await__()

    async def _wait(self) -> Handle:
        call = self._call
        if not isinstance(call, Call):  # deferred: re-encode, then queue
            call = self._call = await call
            call.cancelled = self._cancelled
            return await self._run(call)
        return bind(await self._wait_for(call), call.request.owner)

    def cancel(self) -> None:
        self._cancelled = True
        if isinstance(self._call, Call):
            self._call.cancelled = True
