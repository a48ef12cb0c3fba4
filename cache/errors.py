"""Typed errors. Each message says what to do; a call that raises one leaves the store unchanged.

`CorpsError` is the root of every error corps raises on purpose (the CLI prints
these in one line, without a traceback). It lives here because `corps.cache` is
the lowest layer; every other package imports it from here.
"""

from __future__ import annotations


class CorpsError(Exception):
    """Base of every deliberate corps error."""


class InvalidRequest(CorpsError, ValueError):
    """A call's arguments are wrong; nothing was computed or stored."""


class CacheFullError(CorpsError):
    """The KV store has too few free slots for a call."""


class StoreTooSmall(CacheFullError):
    """A call needs more slots than the whole store has: it could never run."""


class ViewsFull(CacheFullError):
    """The view arena has no room for a call's view now (running calls hold it)."""


class UnknownHandle(InvalidRequest):
    """A handle that names no live message of this engine (freed, or from another engine)."""


class ForeignHandle(UnknownHandle):
    """A handle made by another engine (another `Engine` in this process, or a worker
    process it was sent from): handles never cross engines. Send its text instead and
    encode it again in the receiving engine, under the receiver's visibility."""


class PositionError(InvalidRequest):
    """Offsets that are negative, of the wrong length, or past the model's context length."""


class ContextOverflow(PositionError):
    """A call that would reach past the model's context length: its parents, where they
    sit, and its max_tokens together need more positions than the model has."""


class StoreError(CorpsError):
    """A store directory that cannot be used: unreadable, of another format, damaged."""


class StoreMismatch(StoreError):
    """A store made with another model, dtype, weight format or mode than this engine's:
    its encodings would be wrong here."""


class BrokenInvariant(CorpsError):
    """corps's own bookkeeping is inconsistent (raised by `Engine.check()`): a bug in
    corps, not in your program; please report it with the message."""


def require(ok: bool, what: str) -> None:
    """Raise BrokenInvariant(what) unless ok (checks that must survive `python -O`)."""
    if not ok:
        raise BrokenInvariant(what)
