"""The message table: what the store holds, by message id."""

from __future__ import annotations

import itertools
import threading
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from corps.cache.errors import ForeignHandle, InvalidRequest, UnknownHandle


@dataclass(frozen=True)
class CallFigures:
    """What the call that made a message cost, set once when that call ends
    (`Handle.tokens_encoded`, `tokens_reused`, `ttft`, `leaks` read it)."""

    tokens_encoded: int = 0  # tokens the call ran through the model
    tokens_reused: int = 0  # cached tokens it attended to without encoding them
    tokens_repaired: int = 0  # rewired context tokens it recomputed (a repair)
    tokens_repair_cut: int = 0  # tokens its repair chose that the baseline's work cut
    ttft_s: float | None = None  # a decode's seconds from submit to its first token
    leaks: int = 0  # leaks recorded for the call (allow / warn policies)


@dataclass(frozen=True)
class MessageRecord:
    """A read-only snapshot of one message's record (`Engine.messages()`)."""

    id: int
    kind: str  # "sink", "prefill" or "decode"
    role: str
    owner: str | None
    tokens: tuple[int, ...]  # framed tokens, as encoded
    offset: int  # logical position of its first token when encoded
    parents: tuple[int, ...]
    parent_offsets: tuple[int, ...]
    slots: int  # store slots its encoding holds now (0: text only, or evicted)
    freed: bool
    evicted: bool
    pins: int  # in-flight calls reading it


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
    generated_from: int = 0  # a decode: index in `tokens` of its first sampled token
    generated: int = 0  # a decode: how many tokens it sampled
    finish_reason: str | None = None  # a decode: why it stopped (end_of_turn, max_tokens, ...)
    complete: bool = True  # False: a constrained decode stopped before its text matched
    value: Any = None  # a JSON-schema decode's parsed reply (a pydantic model's instance)
    logprobs: tuple[float, ...] = ()  # a decode asked for them: each sampled token's log-prob
    greedy: tuple[int, ...] = ()  # ... and the argmax token at each of those positions
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] = ()  # ... and the k most likely
    view_of: int | None = None  # a clean re-encoding (leak_policy="reencode"): of which message
    view_for: str | None = None  # ... and for which reader
    figures: CallFigures = field(default_factory=CallFigures)
    # preemption (`corps.engine.exec.memory`): how its tokens went through the model (tokens
    # per forward step, in order), so an evicted encoding is recomputed step for step
    spans: tuple[int, ...] = ()
    # the repair policy its call ran (a string, `corps.engine.repair`; "" for none): a
    # recompute of its evicted encoding repairs its context the same way
    repair: str = ""
    evicted: bool = False  # its encoding was dropped for room; recomputed when read
    read_at: int = 0  # when a call last pinned it (the memory's tick): least recent yields
    started: float = 0.0  # when the workflow that made it started (a policy's victim order)

    def record(self) -> MessageRecord:
        """A read-only snapshot of this record."""
        return MessageRecord(
            self.id, self.kind, self.role, self.owner, tuple(self.tokens), self.offset,
            tuple(self.parents), tuple(self.parent_offsets), len(self.slots), self.freed,
            self.evicted, self.pins,
        )  # fmt: skip

    @property
    def recomputable(self) -> bool:
        """Whether its encoding can be dropped and made again from its parents: an
        encoded prefill or decode whose steps were recorded (not the sink, not text)."""
        return self.kind in ("prefill", "decode") and sum(self.spans) == len(self.tokens) > 0


class Journal(Protocol):
    """What a store is told as the table changes (`corps.cache.durable.DurableStore`)."""

    def added(self, msg: Message) -> None: ...
    def freed(self, msg: Message) -> None: ...
    def forgotten(self, mid: int) -> None: ...


class MessageTable:
    """Messages by id, with pinning so an in-flight call's parents outlive `free`.

    Threads: the engine's worker thread adds messages while the event loop reads
    the table (stats, access checks). Adding and iterating hold a lock; a single
    lookup by id is atomic on its own.

    Records are bounded: a freed message stays readable through its handles, and
    its record is forgotten (`forget`) once no `Handle` object names it, no call
    pins it and no remaining message lists it among its sources. `Handle` objects
    count themselves in (`ref` / `unref`); ids whose last handle died are queued
    in `unreferenced` for the engine to sweep on its own thread.
    """

    def __init__(self) -> None:
        self._messages: dict[int, Message] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._refs: dict[int, int] = {}  # live Handle objects per message id
        self._dependents: dict[int, int] = {}  # records listing the id among their sources
        self._refs_lock = threading.RLock()  # RLock: a handle may die while it is held
        self.unreferenced: deque[int] = deque()
        self.forgotten = 0
        self.origin = uuid.uuid4().hex[:12]  # names this engine in a pickled handle
        # told of every message made, freed and forgotten (`corps.cache.durable`): None
        # unless the engine keeps its messages in a store
        self.journal: Journal | None = None

    def __len__(self) -> int:
        return sum(1 for m in self.all() if not m.freed)

    @property
    def records(self) -> int:
        """Records held, freed ones included (what `forget` keeps bounded)."""
        return len(self._messages)

    # ---- handle references (any thread) ----

    def ref(self, mid: int) -> None:
        with self._refs_lock:
            self._refs[mid] = self._refs.get(mid, 0) + 1

    def unref(self, mid: int) -> None:
        with self._refs_lock:
            n = self._refs.get(mid, 0) - 1
            if n > 0:
                self._refs[mid] = n
                return
            self._refs.pop(mid, None)
        self.unreferenced.append(mid)

    def referenced(self, mid: int) -> bool:
        return mid in self._refs

    def find(self, mid: int) -> Message | None:
        """The record, or None if there is none (never made, or forgotten)."""
        return self._messages.get(mid)

    def forget(self, mid: int) -> list[int]:
        """Drop a freed, unpinned, unreferenced record nothing depends on. Returns its
        sources that lost their last dependent (they may be forgettable now); [] if
        the record must stay."""
        with self._lock, self._refs_lock:
            msg = self._messages.get(mid)
            if msg is None or not msg.freed or msg.pins or mid in self._refs:
                return []
            if self._dependents.get(mid, 0):
                return []
            del self._messages[mid]
            self.forgotten += 1
            if self.journal is not None:
                self.journal.forgotten(mid)
            orphaned = []
            for s in msg.sources:
                n = self._dependents.get(s, 0) - 1
                if n > 0:
                    self._dependents[s] = n
                else:
                    self._dependents.pop(s, None)
                    orphaned.append(s)
            return orphaned

    def __eq__(self, other: object) -> bool:
        return self is other

    __hash__ = object.__hash__

    def next_id(self) -> int:
        return next(self._ids)

    def add(self, message: Message) -> None:
        """Add a record; its `sources` must be final (they count as its dependencies)."""
        with self._lock, self._refs_lock:
            self._messages[message.id] = message
            for s in message.sources:
                self._dependents[s] = self._dependents.get(s, 0) + 1
        if self.journal is not None:
            self.journal.added(message)

    def freed(self, message: Message) -> None:
        """`message` was just freed (`Memory.free`): the journal hears of it."""
        if self.journal is not None:
            self.journal.freed(message)

    def restore(self, messages: list[Message]) -> None:
        """Records read back from a store (`corps.cache.durable`), before any call runs:
        added as they are, and ids from now on continue after the largest."""
        with self._lock, self._refs_lock:
            for m in messages:
                if m.id in self._messages:
                    raise InvalidRequest(f"message {m.id} is already in this table")
                self._messages[m.id] = m
                for s in m.sources:
                    self._dependents[s] = self._dependents.get(s, 0) + 1
            top = max((m.id for m in self._messages.values()), default=-1)
            self._ids = itertools.count(top + 1)

    def get(self, mid: int) -> Message:
        """The message, freed or not (for reading text and provenance)."""
        try:
            return self._messages[mid]
        except KeyError:
            raise UnknownHandle(
                f"no message {mid} in this engine (never made, or freed and forgotten once "
                f"nothing referred to it)"
            ) from None

    def own(self, handle: Any) -> None:
        """ForeignHandle unless `handle` was made by this table's engine."""
        if handle.table is not self:
            raise ForeignHandle(
                f"handle {handle.id} belongs to another engine (engine {handle.table.origin}, "
                f"this one is {self.origin}); handles never cross engines: send its text "
                f"and encode it again here"
            )

    def live(self, mid: int) -> Message:
        """The message if it can still be attended to, else UnknownHandle."""
        msg = self.get(mid)
        if msg.freed:
            raise UnknownHandle(
                f"message {mid} ({msg.role}) was freed; its encoding is "
                f"gone, prefill its text again to use it"
            )
        return msg

    def all(self) -> list[Message]:
        """A snapshot of every message, freed ones included."""
        with self._lock:
            return list(self._messages.values())


class DetachedTable:
    """What a handle names once it has left its engine's process (pickled, e.g. sent to
    a Ray worker): nothing readable. Every lookup raises `ForeignHandle`; so does an
    engine given such a handle as a parent."""

    def __init__(self, origin: str) -> None:
        self.origin = origin

    def ref(self, mid: int) -> None:
        pass

    def unref(self, mid: int) -> None:
        pass

    def _foreign(self, mid: int) -> ForeignHandle:
        return ForeignHandle(
            f"handle {mid} was made by engine {self.origin} in another process; handles "
            f"never cross engines: send its text (read where it was made) and encode it again"
        )

    def get(self, mid: int) -> Message:
        raise self._foreign(mid)

    live = get

    def find(self, mid: int) -> Message | None:
        return None
