"""What each workflow's next step will read (`Engine.expect`): eviction and prefetch by it.

A workflow between steps (waiting for a tool, a person, or the other workflows'
calls) holds messages no queued or running call names yet, so nothing pins
them; least-recently-read eviction cannot tell the document its next turn reads
from the tool output it read once and never will again. A workflow says which it
will read: `engine.expect(doc, last_reply)` inside `engine.workflow(...)` (or a
pattern's run) replaces that workflow's expectation (`engine.expect()` clears
it). Then, under memory pressure:

- eviction takes what no live workflow expects first, and what one expects
  last; within each part the policy's own order (least recently read, or the
  latest workflow's first) decides, so LRU is the fallback, not the rule
  (`NextReads.order`);
- an expected message whose encoding was evicted to the disk tier
  (`EngineConfig.store`) is copied back before the step that reads it, while
  the store has room for it without evicting anything (`NextReads.prefetch`,
  at each admission; `stats().tokens_prefetched`).

Expectations end with their workflow (held by a weak reference: a finished
workflow's tag is collected and its expectation with it) or when it clears them;
calls made outside any workflow share one expectation until they replace it.
Message ids only: a freed message is simply no longer a candidate.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Any

from corps.cache.messages import Message

#: Orders eviction candidates, first to go first (as `corps.engine.exec.memory.Victims`)
Order = Callable[[list[Message]], list[Message]]
_OUTSIDE = 0  # the key of calls made outside any workflow


class NextReads:
    """Each live workflow's expected message ids (its next step's parents)."""

    def __init__(self) -> None:
        # workflow id -> (a weak reference to the workflow, or None outside any, ids)
        self._by: dict[int, tuple[Callable[[], Any] | None, frozenset[int]]] = {}

    def expect(self, workflow: Any, ids: Iterable[int]) -> None:
        """`workflow`'s next step reads `ids` (replacing what it expected); none: it
        expects nothing now. `workflow` None: calls made outside any workflow."""
        key = _OUTSIDE if workflow is None else workflow.id
        wanted = frozenset(ids)
        if not wanted:
            self._by.pop(key, None)
            return
        ref = None if workflow is None else weakref.ref(workflow)
        self._by[key] = (ref, wanted)

    def wanted(self) -> frozenset[int]:
        """The ids some live workflow expects (ended workflows' expectations dropped).
        Read on the torch thread while the loop may `expect`: one snapshot of the map
        (copied in one C call), and only an ended workflow's entry is removed."""
        if not self._by:
            return frozenset()
        entries = list(self._by.items())
        wanted: set[int] = set()
        for key, (ref, ids) in entries:
            if ref is not None and ref() is None:
                self._by.pop(key, None)  # its workflow is gone: nothing can expect under it
            else:
                wanted |= ids
        return frozenset(wanted)

    def order(self, victims: Order) -> Order:
        """`victims` (the policy's order) with every expected message moved behind the
        others, each part in the policy's order (a stable partition)."""

        def ordered(candidates: list[Message]) -> list[Message]:
            ranked = victims(candidates)
            wanted = self.wanted()
            if not wanted:
                return ranked
            return [m for m in ranked if m.id not in wanted] + [m for m in ranked if m.id in wanted]

        return ordered

    def prefetch(self, executor: Any) -> int:
        """Copy back the expected messages the disk tier holds while the store has room
        (`Executor.prefetch`); tokens copied. Torch thread (the loop's schedule phase)."""
        wanted = self.wanted()
        return executor.prefetch(wanted) if wanted else 0
