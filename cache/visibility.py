"""Who may read a message, and information leakage through reused encodings.

A message has an owner (an agent name, or None for the engine's own callers)
and a visibility. A reader may use a message as a parent only if it can see it
(else `AccessDenied`). Under choreography a message's encoding also carries
everything its encoding attended to, transitively (its *sources*). When a
reader attends to a parent whose sources include something the reader cannot
see, that hidden context leaks into the reader's call.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from corps.cache.errors import CorpsError, InvalidRequest


@dataclass(frozen=True)
class Public:
    """Anyone may read it."""

    def allows(self, reader: str | None, owner: str | None) -> bool:
        return True


@dataclass(frozen=True)
class Private:
    """Only its owner may read it."""

    def allows(self, reader: str | None, owner: str | None) -> bool:
        return reader is None or reader == owner


@dataclass(frozen=True, init=False)
class Shared:
    """Its owner and the named readers may read it: `Shared({"alice", "bob"})`."""

    readers: frozenset[str]

    def __init__(self, readers: Iterable[str]) -> None:
        if isinstance(readers, str):
            readers = [readers]
        object.__setattr__(self, "readers", frozenset(readers))

    def allows(self, reader: str | None, owner: str | None) -> bool:
        return reader is None or reader == owner or reader in self.readers


Visibility = Public | Private | Shared
LEAK_POLICIES = ("allow", "warn", "deny", "reencode")


class AccessDenied(InvalidRequest):
    """A reader used (or read) a message it cannot see. Nothing was computed."""


class LeakWarning(UserWarning):
    """A call attended to another agent's hidden context (leak_policy="warn")."""


class LeakageError(CorpsError):
    """Under leak_policy="deny": a call would attend to another agent's hidden context."""


@dataclass(frozen=True)
class Leak:
    """`reader`'s call attends to `parent`, whose encoding attended to hidden `sources`."""

    reader: str | None
    parent: int  # message id
    sources: frozenset[int]  # hidden message ids
    call: str  # what the call was, e.g. "decode by bob"


def can_read(reader: str | None, owner: str | None, visibility: Visibility | None) -> bool:
    """reader None is the engine's own caller, who sees everything."""
    return (visibility or Public()).allows(reader, owner)


def check_policy(policy: str) -> str:
    if policy not in LEAK_POLICIES:
        raise InvalidRequest(f"leak_policy must be one of {LEAK_POLICIES}, got {policy!r}")
    return policy
