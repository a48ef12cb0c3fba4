"""What travels through a mailbox: a message plus how to answer, stream and cancel it."""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectSendStream
from pydantic import BaseModel

from corps.cache.errors import InvalidRequest
from corps.cache.handle import Handle
from corps.engine.request.workflow import CURRENT, RUN, Recorded, Workflow


@dataclass(eq=False)
class Envelope:
    message: Handle | BaseModel
    sender: str | None
    expects_reply: bool
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    done: anyio.Event = field(default_factory=anyio.Event)
    result: Any = None
    error: BaseException | None = None
    cancelled: bool = False
    started: bool = False  # its handler is running (it will reply, whatever happens)
    # ask_stream: where text deltas go. Shared by nested streamed asks; only the
    # ask_stream that made it closes it.
    deltas: MemoryObjectSendStream[str] | None = None
    id: int = 0  # pairs an ask with its reply in traces
    # the asker's workflow: the handler's calls carry it (corps.engine.request.workflow)
    workflow: Workflow | None = field(default_factory=CURRENT.get)
    run: Recorded | None = field(default_factory=RUN.get)  # ... and its recorded run, if any

    def reply(self, result: Any = None, error: BaseException | None = None) -> None:
        self.result, self.error = result, error
        self.done.set()

    async def wait(self) -> Any:
        """The handler's result; cancelling this wait cancels the handler and its nested
        work, and returns once a running handler has ended (its engine calls rolled
        back: shielded, so the store is as it was when the asker gets control back)."""
        try:
            await self.done.wait()
        except BaseException:
            self.cancelled = True
            self.scope.cancel()
            if self.started:  # a handler that never started is skipped: nothing to wait for
                with anyio.CancelScope(shield=True):
                    await self.done.wait()
            raise
        if self.error is not None:
            raise self.error
        return self.result


#: The envelope whose handler is running in the current task (for streaming and nesting).
current: contextvars.ContextVar[Envelope | None] = contextvars.ContextVar(
    "corps_envelope", default=None
)


def check_payload(message: object) -> None:
    if not isinstance(message, Handle | BaseModel):
        raise InvalidRequest(
            f"agents exchange Handles or pydantic payloads, not {type(message).__name__}: "
            f"prefill text first and send its handle"
        )


def label(message: Handle | BaseModel) -> str:
    """A message as errors name it: its id and role, or its payload type; no text."""
    if isinstance(message, Handle):
        return f"message {message.id} ({message.role})"
    return f"{type(message).__name__} payload"


def describe(message: Handle | BaseModel) -> str:
    if isinstance(message, Handle):
        return repr(message)
    return f"{type(message).__name__} payload"
