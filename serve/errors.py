"""Every failure of `corps serve` as an OpenAI error object with its status.

`ServeError` is a refusal the server words itself. Engine errors are worded for
in-process callers (they name the engine's internal ids and owner names), so
`from_engine` gives each kind the server's own words; none quotes a message's
text. Anything else is a bug: 500 with a generic body, logged with its
traceback (code, never values).
"""

from __future__ import annotations

import logging

from corps.cache.errors import (
    CacheFullError,
    ContextOverflow,
    CorpsError,
    InvalidRequest,
    UnknownHandle,
)
from corps.cache.visibility import AccessDenied, LeakageError
from corps.engine.errors import EngineBusy, EngineClosed

log = logging.getLogger("corps.serve")


class ServeError(Exception):
    """A refusal: HTTP `status`, OpenAI error `kind`, what to do, the field at fault."""

    def __init__(
        self, status: int, message: str, kind: str = "invalid_request_error",
        param: str | None = None, headers: dict[str, str] | None = None,
        code: str | None = None,
    ) -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind
        self.param, self.headers, self.code = param, headers or {}, code

    def body(self) -> dict:
        return error_body(self.message, self.kind, self.param, self.code)


def context_exceeded(context: int) -> ServeError:
    """OpenAI's refusal of a prompt that with its max_tokens passes the context (its
    `code` is what clients look for to trim a history)."""
    return ServeError(
        400, f"this model's context length is {context} tokens; the messages with max_tokens "
        f"pass it: send fewer messages or ask for fewer tokens", param="messages",
        code="context_length_exceeded",
    )  # fmt: skip


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None):
    """An OpenAI-style error object."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def from_engine(exc: CorpsError, label: str, context: int = 0) -> ServeError:
    """The server's refusal for an engine error raised by a request of `label` (who
    the request is, `Who.label`) to an engine of `context` positions."""
    if isinstance(exc, LeakageError):
        return ServeError(
            403, f"{label} may not attend to these messages: their encodings carry context "
            f"it may not see (leak policy deny); leave out the messages built on another "
            f"agent's private ones", "permission_error",
        )  # fmt: skip
    if isinstance(exc, AccessDenied):
        return ServeError(
            403, f"{label} may not read every message this request names: one is private to "
            f"another agent", "permission_error",
        )  # fmt: skip
    if isinstance(exc, UnknownHandle):
        return ServeError(
            404, "a message this request names was freed meanwhile; send its content again",
            "not_found_error",
        )  # fmt: skip
    if isinstance(exc, EngineBusy):
        return ServeError(429, "the engine's queue is full; retry later", "rate_limit_error",
                          headers={"Retry-After": "1"})  # fmt: skip
    if isinstance(exc, CacheFullError):
        return ServeError(503, "the KV store is full; retry later or send a shorter prompt",
                          "server_error", headers={"Retry-After": "1"})  # fmt: skip
    if isinstance(exc, EngineClosed):
        return ServeError(503, "the server is shutting down", "server_error")
    if isinstance(exc, ContextOverflow):
        return context_exceeded(context)
    if isinstance(exc, InvalidRequest):  # the client's own input at fault: said as it is
        return ServeError(400, str(exc))
    log.error("engine error %s", type(exc).__name__, exc_info=exc)
    return ServeError(500, "the engine failed on this request", "server_error")
