"""Typed errors of the actor runtime."""

from __future__ import annotations

from corps.cache.errors import CorpsError, InvalidRequest


class AgentError(CorpsError):
    """A handler raised; the agent and message are named, the cause is chained."""


class AskTimeout(CorpsError, TimeoutError):
    """An ask got no reply within its timeout; the agent, the message and the timeout
    are named, and the handler was cancelled."""


class IncompleteReply(UserWarning):
    """A typed reply (`Agent.decode(schema=...)`) that gave no value: cut by its
    `max_tokens` inside a field, or not valid against the schema."""


class MailboxFull(CorpsError):
    """send_nowait to an agent whose bounded mailbox is full; await send() instead."""


class UnknownAgent(InvalidRequest):
    """No agent of that name is running in this runtime."""


class AgentStopped(CorpsError):
    """The agent stopped (supervision or shutdown) before handling the message."""
