"""Access checks and the leak policy of every call, applied before anything is computed.

This is the one home of visibility enforcement and leak handling in the engine:
`Guard.screen` runs for every submission path (awaited calls, `_nowait` calls,
streams, `*_many`), so no path skips it.

Leak policy precedence: the call's own `leak_policy=` argument, else the
agent class's `leak_policy` (agents pass it per call), else the engine's
default (`Engine.open(leak_policy=...)`, "warn").
"""

from __future__ import annotations

import dataclasses
import warnings
from collections import deque
from collections.abc import Awaitable, Callable, Sequence

from corps.cache.handle import Handle
from corps.cache.messages import Message, MessageTable
from corps.cache.visibility import (
    AccessDenied,
    Leak,
    LeakageError,
    LeakWarning,
    can_read,
    check_policy,
)
from corps.engine.exec.call import Call
from corps.engine.request.requests import PrefillRequest
from corps.engine.trace.events import LeakEvent, Recorder, Reencode

__all__ = [
    "AccessEvent",
    "AuditEvent",
    "Guard",
    "LeakWarning",
    "check_access",
    "explain",
    "hidden_sources",
]


@dataclasses.dataclass(frozen=True)
class AccessEvent:
    """One entry of the access log (`Engine.access_events()`): a leak or a re-encoding."""

    kind: str  # "leak" or "reencode"
    detail: str
    leak: Leak | None = None


#: The old name of `AccessEvent` ("audit" now means only the fidelity audit).
AuditEvent = AccessEvent


def describe(msg: Message) -> str:
    """A message named by id, owner and role: never its text, which errors, warnings,
    leak records and exported traces must not carry (a refusal would quote the very
    message it protects)."""
    owner = msg.owner or "the engine"
    return f"message {msg.id} ({owner}'s {msg.role})"


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


Submit = Callable[[PrefillRequest], Awaitable[Handle]]


#: Leak records and guard events kept in memory (the most recent); counts stay exact.
RECENT = 1000


class Guard:
    """Checks access and applies the leak policy for one engine; records leaks.

    Records are bounded for long-running processes: `leaks` and `events` keep the
    `RECENT` latest, `leak_count` / `reencode_count` count all; each call's
    message carries its own leak count (`Handle.leaks`), and a trace file keeps
    every leak event.
    """

    def __init__(
        self, table: MessageTable, *, mode: str, policy: str, recorder: Recorder | None = None
    ) -> None:
        self.table = table
        self.rec = recorder or Recorder()
        self.mode = mode
        self.policy = check_policy(policy)
        self.leaks: deque[Leak] = deque(maxlen=RECENT)
        self.events: deque[AccessEvent] = deque(maxlen=RECENT)
        self.leak_count = 0
        self.reencode_count = 0
        self._clean: dict[tuple[int, str], Handle] = {}  # re-encoded copies, per reader

    def screen(self, call: Call) -> list[Handle]:
        """Screen a queued call: its parents that need a clean copy first (under
        "reencode", see `reencode`); the leaks it records (allow / warn) counted on
        it (`Call.leaks`).

        Raises AccessDenied / LeakageError / UnknownHandle before anything runs.
        Under "reencode" the call's request is made to use every cached clean copy.
        """
        request = call.request
        reader, parents = request.owner, list(request.parents)
        for p in parents:
            self.table.own(p)  # another engine's, unknown or freed handles fail first
            self.table.live(p.id)
        check_access(self.table, reader, parents)
        if reader is None or self.mode != "choreographed":  # re-encoding from text cannot leak
            return []
        kind = "decode" if hasattr(request, "sampling") else "prefill"
        leaks = find_leaks(self.table, reader, parents, f"{kind} by {reader}")
        if not leaks:
            return []
        policy = check_policy(request.leak_policy or self.policy)
        if policy == "deny":
            raise LeakageError(explain(self.table, leaks[0]) + " (leak_policy='deny')")
        if policy == "reencode":
            clean = [self._cached_clean(p, reader) for p in parents]
            fixed = [c if c is not None else p for p, c in zip(parents, clean, strict=True)]
            call.request = dataclasses.replace(request, parents=fixed)
            return [p for p, c in zip(parents, clean, strict=True) if c is None]
        self._record(leaks, policy, call.id)
        call.leaks = len(leaks)
        return []

    def _record(self, leaks: list[Leak], policy: str, call_id: int) -> None:
        """Keep, trace and (under "warn") warn of each leak a call makes."""
        for leak in leaks:
            text = explain(self.table, leak)
            self.leaks.append(leak)
            self.leak_count += 1
            self.events.append(AccessEvent("leak", text, leak))
            if self.rec.on:
                self.rec.emit(
                    LeakEvent(
                        t=self.rec.now(),
                        reader=leak.reader,
                        parent=leak.parent,
                        sources=sorted(leak.sources),
                        call=leak.call,
                        call_id=call_id,
                        detail=text,
                        policy=policy,
                    )
                )
            if policy == "warn":
                warnings.warn(text, LeakWarning, stacklevel=5)

    async def reencode(self, request, submit: Submit) -> object:
        """`request` with every leaking parent replaced by a clean copy for its reader."""
        reader = request.owner
        parents = [await self.clean_view(p, reader, submit) for p in request.parents]
        return dataclasses.replace(request, parents=parents)

    def _cached_clean(self, parent: Handle, reader: str) -> Handle | None:
        if not hidden_sources(self.table, reader, parent.id):
            return parent
        cached = self._clean.get((parent.id, reader))
        return cached if cached is not None and not cached.freed else None

    async def clean_view(self, parent: Handle, reader: str, submit: Submit) -> Handle:
        """`parent` itself if its encoding hides nothing from `reader`; else a re-encoding
        of its tokens that attends only to what `reader` may see (cached per reader)."""
        cached = self._cached_clean(parent, reader)
        if cached is not None:
            return cached
        table = self.table
        msg = table.get(parent.id)
        kept = [
            (Handle(q, table), off)
            for q, off in zip(msg.parents, msg.parent_offsets, strict=True)
            if can_read(reader, table.get(q).owner, table.get(q).visibility)
        ]
        parents = [await self.clean_view(q, reader, submit) for q, _ in kept]
        request = PrefillRequest(
            list(msg.tokens),
            role=msg.role,
            parents=parents,
            offsets=[off for _, off in kept],
            new_offset=msg.offset,
            frame=False,
            owner=msg.owner,
            visibility=msg.visibility,
        )
        view = await submit(request)
        copy = table.get(view.id)
        copy.text, copy.view_of, copy.view_for = msg.text, msg.id, reader
        copy.generated_from, copy.generated = msg.generated_from, msg.generated
        self._clean[(parent.id, reader)] = view
        self.reencode_count += 1
        self.events.append(
            AccessEvent("reencode", f"re-encoded message {msg.id} for {reader} as {view.id}")
        )
        if self.rec.on:
            self.rec.emit(Reencode(t=self.rec.now(), message=msg.id, reader=reader, clean=view.id))
        return view

    def forget(self, mid: int) -> list[Handle]:
        """Drop the clean copies of message `mid` (it was freed); returns them to free."""
        keys = [k for k in self._clean if k[0] == mid]
        return [self._clean.pop(k) for k in keys]
