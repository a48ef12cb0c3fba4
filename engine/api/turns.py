"""Recorded runs: the calls of a named run kept in the store, so a killed run resumes.

Inside `with engine.recorded("RUN"):` (an engine opened with `store=`), every call
that completes is recorded in the store as (run, the call's key, n) -> its message,
where the key is a digest of everything the call's result depends on (kind, text or
header, role, the parents' ids and offsets, owner, visibility, sampling settings
with the seed and any constraint) and n counts calls of the same key in that run,
in the order they were made. Run again under the same name, a call whose (key, n)
was recorded, and whose message is still live, returns that message at once
(`Call.replayed`), without running; the first call that differs, or was never
completed, runs, and from it on the run goes as before. So a workflow killed at its
last turn, run again with the same inputs, seed and name, replays every finished
turn from the store and computes only what was left.

A recorded message keeps its id, so later calls over it (which name it as a parent)
have the same keys as in the first run. Calls whose key differs in a run made with
other inputs or another seed simply run. A call with `seed=None` samples freshly
when it runs; replayed, it is the sample the first run drew.

Outside inputs: `with engine.recorded(NAME) as run:` gives the run (`RecordedRun`),
and `await run.input(KEY)` the message given as its input KEY (`run.give(KEY,
text)`: prefilled, and kept in the store as the run's turn (run, "input:" KEY, 0)).
An input not given yet pauses the run: `AwaitingInput` (or, with `wait=True`, a
wait in this process). Given later, from this process or another, the run made
again under its name replays what it finished and reads the input as a message
already encoded.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any

import anyio

from corps.cache.durable import DurableStore
from corps.cache.errors import InvalidRequest
from corps.cache.handle import Handle
from corps.cache.messages import MessageTable
from corps.cache.visibility import Private, Public, Shared
from corps.engine.errors import AwaitingInput
from corps.engine.request.requests import DecodeRequest, PrefillRequest
from corps.engine.request.workflow import RUN, Recorded

#: request fields that change nothing a call makes (scheduling, accounting, policy)
IGNORED = {"objective", "tenant", "audit", "leak_policy", "parents"}
#: the key prefix of a run's outside inputs among its turns
INPUT = "input:"


@contextmanager
def recorded(
    name: str, turns: Turns | None = None, prefill: Callable[..., Awaitable[Handle]] | None = None
) -> Iterator[RecordedRun]:
    """Record (or replay) every call made inside as run `name` (see the module doc);
    yields the run, whose outside inputs `turns` keeps (given with `prefill`)."""
    _check_name(name, "a run's name")
    token = RUN.set(Recorded(name))
    try:
        yield RecordedRun(name, turns, prefill)
    finally:
        RUN.reset(token)


def _check_name(name: object, what: str) -> None:
    if not isinstance(name, str) or not name or len(name) > 200:
        raise InvalidRequest(f"{what} is a string of 1 to 200 characters, got {name!r}")


@dataclass(frozen=True)
class RecordedRun:
    """A recorded run, as `with engine.recorded(NAME) as run:` gives it: its name and
    its outside inputs (a person's answer, a tool's callback)."""

    name: str
    turns: Turns | None = None
    prefill: Callable[..., Awaitable[Handle]] | None = None

    async def input(self, key: str, *, wait: bool = False, owner: str | None = None) -> Handle:
        """The message given as this run's input `key` (`give`), bound to `owner`. Not
        given yet, the run pauses here: `AwaitingInput` (every call it finished is kept;
        give the input and run it again under its name), or with `wait`, this waits in
        this process until it is given."""
        _check_name(key, "an input's key")
        while (handle := self._turns().given(self.name, key, owner)) is None:
            if not wait:
                raise AwaitingInput(self.name, key)
            await self._turns().given_event(self.name, key).wait()
        return handle

    async def give(self, key: str, message: Any, **args: Any) -> Handle:
        """Give this run its input `key`: `message` prefilled with `args` as
        `Engine.prefill` takes them, kept in the store (given again, the newer one
        counts); a run waiting for it wakes. Giving is not a call of the run."""
        _check_name(key, "an input's key")
        turns = self._turns()
        token = RUN.set(None)
        try:
            handle = await self.prefill(message, **args)
        finally:
            RUN.reset(token)
        turns.give(self.name, key, handle)
        return handle

    def _turns(self) -> Turns:
        if self.turns is None:
            raise InvalidRequest("this run has no store: open the engine with store=DIR")
        return self.turns


def key_of(request: PrefillRequest | DecodeRequest) -> str:
    """A digest of what the call's message depends on (see the module doc)."""
    kind = "decode" if isinstance(request, DecodeRequest) else "prefill"
    parts: dict[str, Any] = {"kind": kind, "parents": [h.id for h in request.parents]}
    for f in fields(request):
        if f.name not in IGNORED:
            parts[f.name] = _plain(getattr(request, f.name))
    text = json.dumps(parts, sort_keys=True, default=repr)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _plain(v: Any) -> Any:
    """A request's field as JSON values, stable across processes."""
    if isinstance(v, Public | Private):
        return type(v).__name__
    if isinstance(v, Shared):
        return sorted(v.readers)
    if hasattr(v, "__dataclass_fields__"):  # sampling settings, a constraint, a repair
        return {f.name: _plain(getattr(v, f.name)) for f in fields(v) if f.compare}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return v if isinstance(v, str | int | float | bool | type(None)) else repr(v)


class Turns:
    """The recorded calls of one engine's runs (its store's `turns`)."""

    def __init__(self, store: DurableStore, table: MessageTable) -> None:
        self.store, self.table = store, table
        self._seen: dict[tuple[str, str], int] = {}  # calls of each (run, key) made so far
        self._given: dict[tuple[str, str], anyio.Event] = {}  # inputs waited for here

    def begin(self, request: PrefillRequest | DecodeRequest) -> tuple[str, str, int] | None:
        """The call's place in the current run, (run, key, n); None outside a run."""
        recorded = RUN.get()
        if recorded is None:
            return None
        run, key = recorded.name, key_of(request)
        n = self._seen.get((run, key), 0)
        self._seen[(run, key)] = n + 1
        return run, key, n

    def replay(self, place: tuple[str, str, int], owner: str | None) -> Handle | None:
        """The message recorded for this call, if it is still live; else None."""
        mid = self.store.turn(*place)
        msg = None if mid is None else self.table.find(mid)
        if msg is None or msg.freed:
            return None
        return Handle(mid, self.table, owner)

    def record(self, place: tuple[str, str, int], handle: Handle) -> None:
        self.store.record_turn(*place, handle.id)

    def given(self, run: str, key: str, owner: str | None) -> Handle | None:
        """Run `run`'s input `key`, if it was given and is still live; else None."""
        return self.replay((run, INPUT + key, 0), owner)

    def given_event(self, run: str, key: str) -> anyio.Event:
        """Set when run `run`'s input `key` is given in this process."""
        return self._given.setdefault((run, key), anyio.Event())

    def give(self, run: str, key: str, handle: Handle) -> None:
        """Keep `handle` as run `run`'s input `key`; whoever waits for it wakes."""
        self.store.record_turn(run, INPUT + key, 0, handle.id)
        event = self._given.pop((run, key), None)
        if event is not None:
            event.set()
