"""Messages' lifetimes: freeing encodings, by hand, by owner, and when the last
`Handle` naming one is collected (`auto_free`), and forgetting records nothing
refers to. Event loop only (the engine sweeps after each step: `Scheduler.stepped`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from corps.cache.handle import Handle
from corps.engine.api.access import Guard
from corps.engine.errors import InvalidRequest
from corps.engine.exec.executor import Executor
from corps.engine.trace.events import Freed, Recorder


class Lifetimes:
    """Frees the messages of one engine's table and keeps it from growing."""

    def __init__(
        self, executor: Executor, guard: Guard, recorder: Recorder, *, auto_free: bool
    ) -> None:
        self.executor, self.guard, self.recorder = executor, guard, recorder
        self.auto_free = auto_free  # free an encoding once no Handle names it
        self._deferred: list[int] = []  # unreferenced ids still pinned by a running call

    def held_by(self, owners: Iterable[str]) -> int:
        """Store slots held by the live messages these agents own."""
        return sum(len(m.slots) for m in self._owned(owners))

    def free_owned(self, owners: Iterable[str]) -> int:
        """Free every live message these agents own; how many (`Engine.free_owned`)."""
        mids = [m.id for m in self._owned(owners)]
        for mid in mids:
            self._free_id(mid)
        self.sweep()
        return len(mids)

    def _owned(self, owners: Iterable[str]) -> list:
        """The live message records these agents own."""
        names = set(owners)
        return [m for m in self.executor.table.all() if not m.freed and m.owner in names]

    def live_ids(self, handles: Iterable[Any]) -> list[int]:
        """The ids of these handles, each a live message of this engine: InvalidRequest
        for what is not a handle, ForeignHandle / UnknownHandle as a call's parents."""
        table = self.executor.table
        for h in handles:
            if not isinstance(h, Handle):
                raise InvalidRequest(f"expected handles, got {type(h).__name__}")
            table.own(h)
            table.live(h.id)
        return [h.id for h in handles]

    def free(self, handle: Handle) -> None:
        """Free a message and its re-encoded copies (`Engine.free`)."""
        self._free_id(handle.id, handle)
        self.sweep()

    def _free_id(self, mid: int, handle: Handle | None = None) -> None:
        self.executor.free(handle or Handle(mid, self.executor.table))
        if self.recorder.on:
            self.recorder.emit(Freed(t=self.recorder.now(), id=mid))
        for copy in self.guard.forget(mid):
            if not copy.freed:
                self._free_id(copy.id, copy)

    def sweep(self) -> None:
        """Handle objects that died since the last sweep: free their messages (with
        `auto_free`), and forget freed records nothing refers to. Event loop only."""
        table = self.executor.table
        todo, self._deferred = self._deferred, []
        while table.unreferenced:
            todo.append(table.unreferenced.popleft())
        while todo:
            mid = todo.pop()
            msg = table.find(mid)
            if msg is None or msg.kind == "sink" or table.referenced(mid):
                continue
            if not msg.freed:
                if not self.auto_free:
                    continue
                self._free_id(mid)
            if msg.pins:
                self._deferred.append(mid)  # a running call reads it: later
                continue
            todo.extend(table.forget(mid))
