"""Handles: the small immutable references agents pass around instead of text."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from corps.cache.messages import Message, MessageTable


@dataclass(frozen=True)
class Handle:
    """A message in one engine's store, by id. Cheap to copy, hash and send."""

    id: int
    table: MessageTable

    @property
    def _msg(self) -> Message:
        return self.table.get(self.id)

    @property
    def text(self) -> str:
        return self._msg.text

    @property
    def tokens(self) -> list[int]:
        return list(self._msg.tokens)

    @property
    def role(self) -> str:
        return self._msg.role

    @property
    def owner(self) -> str | None:
        return self._msg.owner

    @property
    def visibility(self) -> Any:
        return self._msg.visibility

    @property
    def parents(self) -> tuple[Handle, ...]:
        return tuple(Handle(p, self.table) for p in self._msg.parents)

    @property
    def sources(self) -> frozenset[Handle]:
        """Every message this one's encoding attended to, transitively (its provenance)."""
        return frozenset(Handle(s, self.table) for s in self._msg.sources)

    @property
    def offset(self) -> int:
        return self._msg.offset

    @property
    def length(self) -> int:
        return len(self._msg.tokens)

    @property
    def ttft(self) -> float | None:
        """Seconds from submitting this decode to its first token (None for prefills)."""
        return self._msg.extra.get("ttft_s")

    @property
    def freed(self) -> bool:
        return self._msg.freed

    def __repr__(self) -> str:
        msg = self._msg
        text = msg.text if len(msg.text) <= 40 else msg.text[:39] + "…"
        return f"Handle(id={self.id}, role={msg.role!r}, text={text!r})"
