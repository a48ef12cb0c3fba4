"""Handles: the small immutable references agents pass around instead of text.

A handle may be *bound* to a reader (an agent name). Reading a bound handle's
content (`text`, `tokens`) checks that its reader may see the message, and the
handles it leads to (`parents`, `sources`) stay bound to the same reader, so
walking from a public message to a private parent and reading it raises
`AccessDenied`. An unbound handle (reader None) belongs to the engine's own
caller, who sees everything. Metadata (role, owner, visibility, length,
offset) is readable by anyone holding the handle.

The engine binds the handles of calls made as an agent (`owner=`) to that
agent, and the runtime rebinds every handle it delivers to the receiving agent.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from corps.cache.messages import DetachedTable, Message, MessageTable
from corps.cache.visibility import AccessDenied, can_read


@dataclass(frozen=True)
class Handle:
    """A message in one engine's store, by id. Cheap to copy, hash and send.

    Two handles are equal when they name the same message of the same engine,
    whoever they are bound to.
    """

    id: int
    table: MessageTable
    reader: str | None = field(default=None, compare=False)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        """A pydantic field typed Handle (`tuple[Handle, ...]`, `Handle | None`) holds
        the handle itself, checked by type, with no `arbitrary_types_allowed`; a
        dump (`model_dump`, JSON) gives the message's id, never its text."""
        from pydantic_core import core_schema

        return core_schema.is_instance_schema(
            cls,
            serialization=core_schema.plain_serializer_function_ser_schema(lambda h: h.id),
        )

    # Each Handle object counts itself in its table, so a freed message's record can
    # be forgotten once no handle names it (see MessageTable).
    def __post_init__(self) -> None:
        self.table.ref(self.id)

    def __del__(self) -> None:
        try:
            self.table.unref(self.id)
        except Exception:  # interpreter shutdown: the table may be gone already
            pass

    def __copy__(self) -> Handle:
        return self  # immutable: a copy would not count itself

    def __deepcopy__(self, memo: dict) -> Handle:
        return self

    def __reduce__(self) -> tuple:
        # pickled (sent to another process): the message stays behind; what arrives
        # names it but reads nothing (ForeignHandle), so no text escapes its visibility
        return (_detached, (self.id, self.table.origin, self.reader))

    @property
    def detached(self) -> bool:
        """True for a handle that was pickled out of its engine's process."""
        return isinstance(self.table, DetachedTable)

    @property
    def _msg(self) -> Message:
        return self.table.get(self.id)

    def _readable(self) -> Message:
        msg = self._msg
        if not can_read(self.reader, msg.owner, msg.visibility):
            raise AccessDenied(
                f"{self.reader} cannot read message {self.id} ({msg.owner}'s {msg.role}): it is "
                f"{type(msg.visibility).__name__.lower()} to {msg.owner}"
            )
        return msg

    @property
    def text(self) -> str:
        """The message's content text (AccessDenied if this handle's reader cannot see it)."""
        return self._readable().text

    @property
    def tokens(self) -> list[int]:
        """The message's framed token ids (AccessDenied if its reader cannot see it)."""
        return list(self._readable().tokens)

    @property
    def generated(self) -> list[int]:
        """The token ids a decode sampled ([] for a prefill); AccessDenied as for `tokens`.

        A decoded message's tokens are its header, these, then the footer that closes
        the turn (SmolLM2: `\\n` after `<|im_end|>`, or all of `<|im_end|>\\n` when
        max_tokens cut it).
        """
        msg = self._readable()
        return list(msg.tokens[msg.generated_from : msg.generated_from + msg.generated])

    @property
    def generated_from(self) -> int:
        """Where a decode's sampled tokens start in `tokens` (0 for a prefill)."""
        return self._msg.generated_from

    @property
    def logprobs(self) -> tuple[float, ...]:
        """A decode made with `logprobs=True`: each of `generated`'s log-probability
        under the model at its position (temperature 1, before top-p/top-k and any
        constraint's mask); () otherwise. AccessDenied as for `tokens`."""
        return self._readable().logprobs

    @property
    def top_logprobs(self) -> tuple[tuple[tuple[int, float], ...], ...]:
        """A decode made with `top_logprobs=k`: at each of `generated`'s positions, the
        k most likely (token, log-probability), most likely first (the same
        distribution as `logprobs`); () otherwise. AccessDenied as for `tokens`."""
        return self._readable().top_logprobs

    @property
    def greedy(self) -> tuple[int, ...]:
        """A decode made with `logprobs=True`: the token greedy decoding would have
        emitted at each position of `generated` (the argmax); () otherwise."""
        return self._readable().greedy

    @property
    def kind(self) -> str:
        """ "prefill" or "decode" (or "sink", the attention sink every call sees)."""
        return self._msg.kind

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
        """The messages this one attended to, bound to the same reader."""
        return tuple(Handle(p, self.table, self.reader) for p in self._msg.parents)

    @property
    def sources(self) -> frozenset[Handle]:
        """Every message this one's encoding attended to, transitively (its provenance)."""
        return frozenset(Handle(s, self.table, self.reader) for s in self._msg.sources)

    @property
    def offset(self) -> int:
        """The logical position of the message's first token when it was encoded."""
        return self._msg.offset

    @property
    def parent_offsets(self) -> tuple[int, ...]:
        """Where each of `parents` sat when this message was encoded (as placed)."""
        return self._msg.parent_offsets

    @property
    def length(self) -> int:
        return len(self._msg.tokens)

    @property
    def finish_reason(self) -> str | None:
        """Why a decode stopped: "end_of_turn", "max_tokens", "stop_string",
        "constraint" (its constraint allowed nothing more) or "forced"; None for a
        prefill."""
        return self._msg.finish_reason

    @property
    def complete(self) -> bool:
        """False when a constrained decode stopped (max_tokens) before its text matched
        its constraint: the text is then a valid prefix, not a whole match."""
        return self._msg.complete

    @property
    def value(self) -> Any:
        """A `json_schema` decode's reply parsed: an instance of the pydantic model it
        was given (`schema=` on `Agent.decode`), else the JSON value; None when the
        reply is incomplete, does not validate, or the decode had no schema."""
        return self._readable().value

    @property
    def ttft(self) -> float | None:
        """Seconds from submitting this decode to its first token (None for prefills)."""
        return self._msg.figures.ttft_s

    @property
    def tokens_encoded(self) -> int:
        """Tokens the call that made this message ran through the model."""
        return self._msg.figures.tokens_encoded

    @property
    def tokens_reused(self) -> int:
        """Cached tokens that call attended to without encoding them (the sink included)."""
        return self._msg.figures.tokens_reused

    @property
    def tokens_repaired(self) -> int:
        """Rewired context tokens the call that made this message recomputed in its
        own context (its repair, `corps.engine.repair`); counted in tokens_encoded."""
        return self._msg.figures.tokens_repaired

    @property
    def tokens_repair_cut(self) -> int:
        """Tokens its repair's policy chose that were not recomputed: a repair never
        recomputes more than the baseline would encode of the same context
        (`corps.engine.exec.baseline_work`)."""
        return self._msg.figures.tokens_repair_cut

    @property
    def leaks(self) -> int:
        """Leaks recorded for the call that made this message (allow / warn policies)."""
        return self._msg.figures.leaks

    @property
    def freed(self) -> bool:
        return self._msg.freed

    def __repr__(self) -> str:
        if self.detached:
            return f"Handle(id={self.id}, of engine {self.table.origin} in another process)"
        msg = self._msg
        if not can_read(self.reader, msg.owner, msg.visibility):
            return f"Handle(id={self.id}, role={msg.role!r}, hidden from {self.reader})"
        text = msg.text if len(msg.text) <= 40 else msg.text[:39] + "…"
        return f"Handle(id={self.id}, role={msg.role!r}, text={text!r})"


def _detached(mid: int, origin: str, reader: str | None) -> Handle:
    return Handle(mid, DetachedTable(origin), reader)  # type: ignore[arg-type]


def bind(value: Any, reader: str | None) -> Any:
    """`value` with every handle in it bound to `reader`: a handle, or a pydantic payload
    (fields, and lists / tuples / sets / dicts of them, nested payloads included)."""
    from pydantic import BaseModel

    if isinstance(value, Handle):
        return dataclasses.replace(value, reader=reader)
    if isinstance(value, BaseModel):
        update = {}
        for name in type(value).model_fields:
            old = getattr(value, name)
            new = bind(old, reader)
            if new is not old:
                update[name] = new
        return value.model_copy(update=update) if update else value
    if isinstance(value, list | tuple | set | frozenset):
        items = [bind(v, reader) for v in value]
        if all(a is b for a, b in zip(items, value, strict=False)):
            return value
        return type(value)(items)
    if isinstance(value, dict):
        items = {k: bind(v, reader) for k, v in value.items()}
        return items if any(items[k] is not value[k] for k in value) else value
    return value
