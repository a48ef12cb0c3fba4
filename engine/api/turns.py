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
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields
from typing import Any

from corps.cache.durable import DurableStore
from corps.cache.errors import InvalidRequest
from corps.cache.handle import Handle
from corps.cache.messages import MessageTable
from corps.cache.visibility import Private, Public, Shared
from corps.engine.request.requests import DecodeRequest, PrefillRequest
from corps.engine.request.workflow import RUN, Recorded

#: request fields that change nothing a call makes (scheduling, accounting, policy)
IGNORED = {"objective", "tenant", "audit", "leak_policy", "parents"}


@contextmanager
def recorded(name: str) -> Iterator[str]:
    """Record (or replay) every call made inside as run `name` (see the module doc)."""
    if not isinstance(name, str) or not name or len(name) > 200:
        raise InvalidRequest(f"a run's name is a string of 1 to 200 characters, got {name!r}")
    token = RUN.set(Recorded(name))
    try:
        yield name
    finally:
        RUN.reset(token)


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
