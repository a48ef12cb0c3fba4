"""A message's record as a store row: JSON values and back (`corps.cache.durable`).

Kept: everything a message says of itself and of how it was made (tokens, text,
role, owner, visibility, parents and where they sat, sources, figures, the steps
it was encoded in, its repair). Not kept: its slots and pins (of one process) and
its parsed value; a record that had an encoding comes back `evicted`, to be
copied in or encoded again when read.
"""

from __future__ import annotations

from typing import Any

from corps.cache.errors import StoreError
from corps.cache.messages import CallFigures, Message
from corps.cache.visibility import Private, Public, Shared


def encode(msg: Message) -> dict[str, Any]:
    """A message's record as JSON values (its slots, pins and parsed value are not kept)."""
    return {
        "id": msg.id, "tokens": msg.tokens, "text": msg.text, "role": msg.role,
        "kind": msg.kind, "offset": msg.offset, "parents": list(msg.parents),
        "parent_offsets": list(msg.parent_offsets), "owner": msg.owner,
        "visibility": _visibility(msg.visibility), "sources": sorted(msg.sources),
        "freed": msg.freed, "generated_from": msg.generated_from, "generated": msg.generated,
        "finish_reason": msg.finish_reason, "complete": msg.complete,
        "logprobs": list(msg.logprobs), "greedy": list(msg.greedy),
        "top_logprobs": [[list(p) for p in top] for top in msg.top_logprobs],
        "view_of": msg.view_of, "view_for": msg.view_for,
        "figures": vars(msg.figures), "spans": list(msg.spans), "repair": msg.repair,
        "encoded": bool(msg.slots) or msg.evicted,
    }  # fmt: skip


def decode(r: dict[str, Any]) -> Message:
    """A record read back: no slots; `evicted` if it had an encoding (encoded again
    when read, unless a saved one is copied in first)."""
    msg = Message(
        int(r["id"]), [int(t) for t in r["tokens"]], str(r["text"]), str(r["role"]),
        str(r["kind"]), [], int(r["offset"]), tuple(r["parents"]),
        tuple(r["parent_offsets"]), r["owner"], _visibility_of(r["visibility"]),
        sources=frozenset(r["sources"]), freed=bool(r["freed"]),
        generated_from=r["generated_from"], generated=r["generated"],
        finish_reason=r["finish_reason"], complete=r["complete"],
        logprobs=tuple(r["logprobs"]), greedy=tuple(r["greedy"]),
        top_logprobs=tuple(tuple((int(t), float(p)) for t, p in top) for top in r["top_logprobs"]),
        view_of=r["view_of"], view_for=r["view_for"], figures=CallFigures(**r["figures"]),
        spans=tuple(r["spans"]), repair=str(r["repair"]),
    )  # fmt: skip
    msg.evicted = bool(r["encoded"])
    return msg


def _visibility(v: Any) -> Any:
    if v is None or isinstance(v, Public):
        return None if v is None else "public"
    if isinstance(v, Private):
        return "private"
    if isinstance(v, Shared):
        return sorted(v.readers)
    raise StoreError(f"a message's visibility {type(v).__name__} cannot be stored")


def _visibility_of(v: Any) -> Any:
    if v is None:
        return None
    if v == "public":
        return Public()
    if v == "private":
        return Private()
    if isinstance(v, list):
        return Shared(set(v))
    raise ValueError(f"visibility {v!r}")
