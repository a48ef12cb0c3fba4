"""Access checks and leak detection for a call, applied before anything is computed."""

from __future__ import annotations

from collections.abc import Sequence

from corps.cache.handle import Handle
from corps.cache.messages import Message, MessageTable
from corps.cache.visibility import AccessDenied, Leak, can_read


def describe(msg: Message) -> str:
    owner = msg.owner or "the engine"
    text = msg.text if len(msg.text) <= 40 else msg.text[:39] + "…"
    return f"message {msg.id} ({owner}'s {msg.role}: {text!r})"


def check_access(table: MessageTable, reader: str | None, parents: Sequence[Handle]) -> None:
    """AccessDenied if `reader` cannot see one of `parents`."""
    for p in parents:
        msg = table.get(p.id)
        if not can_read(reader, msg.owner, msg.visibility):
            raise AccessDenied(
                f"{reader} cannot read {describe(msg)}: it is "
                f"{type(msg.visibility).__name__.lower()} to {msg.owner}; ask its owner to "
                f"share it (Shared/Public) or leave it out of parents"
            )


def hidden_sources(table: MessageTable, reader: str | None, mid: int) -> frozenset[int]:
    """Sources of message `mid`'s encoding that `reader` cannot see."""
    out = set()
    for s in table.get(mid).sources:
        src = table.get(s)
        if not can_read(reader, src.owner, src.visibility):
            out.add(s)
    return frozenset(out)


def find_leaks(
    table: MessageTable, reader: str | None, parents: Sequence[Handle], call: str
) -> list[Leak]:
    leaks = []
    for p in parents:
        hidden = hidden_sources(table, reader, p.id)
        if hidden:
            leaks.append(Leak(reader, p.id, hidden, call))
    return leaks


def explain(table: MessageTable, leak: Leak) -> str:
    hidden = ", ".join(describe(table.get(s)) for s in sorted(leak.sources))
    return (
        f"{leak.call} attends to {describe(table.get(leak.parent))}, whose encoding attended "
        f"to what {leak.reader} cannot see: {hidden}"
    )
