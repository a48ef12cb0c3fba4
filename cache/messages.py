"""The message table: what the store holds, by message id."""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import Any

from corps.cache.errors import UnknownHandle


@dataclass
class Message:
    """One encoded (or, in baseline mode, text-only) message."""

    id: int
    tokens: list[int]  # framed tokens, as encoded
    text: str  # content text, without framing
    role: str
    kind: str  # "sink", "prefill" or "decode"
    slots: list[int]  # store slots of its K/V; empty for text-only messages
    offset: int  # logical position of its first token when encoded
    parents: tuple[int, ...]  # ids it attended to, in order
    parent_offsets: tuple[int, ...]  # where each parent sat when this was encoded
    owner: str | None = None
    visibility: Any = None
    sources: frozenset[int] = frozenset()  # every message its encoding attended to, transitively
    freed: bool = False
    pins: int = 0  # in-flight calls reading its slots
    extra: dict[str, Any] = field(default_factory=dict)


class MessageTable:
    """Messages by id, with pinning so an in-flight call's parents outlive `free`.

    Threads: the engine's worker thread adds messages while the event loop reads
    the table (stats, access checks). Adding and iterating hold a lock; a single
    lookup by id is atomic on its own.
    """

    def __init__(self) -> None:
        self._messages: dict[int, Message] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return sum(1 for m in self.all() if not m.freed)

    def __eq__(self, other: object) -> bool:
        return self is other

    __hash__ = object.__hash__

    def next_id(self) -> int:
        return next(self._ids)

    def add(self, message: Message) -> None:
        with self._lock:
            self._messages[message.id] = message

    def get(self, mid: int) -> Message:
        """The message, freed or not (for reading text and provenance)."""
        try:
            return self._messages[mid]
        except KeyError:
            raise UnknownHandle(f"no message {mid} in this engine") from None

    def live(self, mid: int) -> Message:
        """The message if it can still be attended to, else UnknownHandle."""
        msg = self.get(mid)
        if msg.freed:
            raise UnknownHandle(
                f"message {mid} ({msg.role}: {_preview(msg.text)}) was freed; its encoding is "
                f"gone, prefill its text again to use it"
            )
        return msg

    def all(self) -> list[Message]:
        """A snapshot of every message, freed ones included."""
        with self._lock:
            return list(self._messages.values())


def _preview(text: str, n: int = 32) -> str:
    return repr(text if len(text) <= n else text[: n - 1] + "…")
