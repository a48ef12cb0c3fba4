"""`AskStream`: one ask's text deltas as they are decoded, then its result (what
`Runtime.ask_stream` returns)."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from pydantic import BaseModel

from corps.agents.errors import AgentStopped
from corps.cache.handle import Handle


class AskStream:
    """The text deltas of one ask, then its `result` (see `Runtime.ask_stream`).

    The ask runs in the runtime's own task group, so iterating never yields from
    inside a task group or cancel scope of the caller's.
    """

    def __init__(
        self,
        start: Callable[[str, Handle | BaseModel, Callable[[], Awaitable[None]]], None],
        ask: Callable[..., Awaitable[Any]],
        to: str,
        msg: Handle | BaseModel,
        timeout: float | None,
    ):
        """`start(to, msg, run)` checks the ask (a started runtime, a payload it takes, an
        agent `to`) and runs `run` in the runtime's task group; `ask` is `Runtime.ask`."""
        self._start, self._ask = start, ask
        self._to, self._msg, self._timeout = to, msg, timeout
        self.result: Any = None

    async def __aiter__(self) -> AsyncIterator[str]:
        send, recv = anyio.create_memory_object_stream[str](max_buffer_size=math.inf)
        scope, finished = anyio.CancelScope(), anyio.Event()
        outcome: list[Any] = []  # [result] or [None, error]

        async def run() -> None:
            try:
                with scope:
                    result = await self._ask(
                        self._to, self._msg, timeout=self._timeout, deltas=send
                    )
                    outcome.append(result)
            except Exception as exc:
                outcome.extend([None, exc])
            except BaseException:
                outcome.extend([None, AgentStopped(f"{self._to}: the runtime shut down")])
                raise
            finally:
                send.close()
                finished.set()

        try:
            self._start(self._to, self._msg, run)
        except BaseException:  # refused before it ran: nothing streams
            send.close()
            recv.close()
            raise
        try:
            async with recv:
                async for delta in recv:
                    yield delta
        finally:
            if not finished.is_set():
                scope.cancel()  # the consumer left early (or was cancelled): leaving
                with anyio.CancelScope(shield=True):  # returns once its calls rolled back
                    await finished.wait()
        await finished.wait()
        if len(outcome) == 2:
            raise outcome[1]
        if not outcome:
            raise AgentStopped(f"{self._to}: the ask was cancelled")
        self.result = outcome[0]
