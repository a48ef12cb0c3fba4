"""Workflow-level admission: start a workflow only when the store can hold it.

Calls are admitted by the scheduler one task group at a time, and a call that
cannot get memory waits while other calls run. That does not stop many
workflows from starting at once and together filling the store with the live
messages of workflows none of which can finish: then calls fail with
`CacheFullError` although every workflow alone would fit. `WorkflowGate` is the
step before: a workflow (a pattern's `Run`) enters the gate before its first
call and leaves it when it ends. It may enter when no other workflow is in, or
when the peaks of the workflows in, plus its own, fit in `share` of the store
and the store has its peak free now.

A workflow's peak is learned: the most store tokens any finished workflow of
the same kind (pattern) held. A kind never seen to its end runs one at a time
(counted as `first_guess` of the store) until one ends and teaches its peak.
Waiting workflows enter in arrival order (a large one is not passed by small
ones forever).

`most` also caps how many workflows are in at once, whatever memory allows
(`EngineConfig.max_workflows`): under a burst of arrivals the workflows beyond
it queue whole, first come first served, instead of each joining the batch and
widening every running workflow's steps. With `capacity=None` the gate counts
only (no store to fit: mode "hf", or `admission=False`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio

from corps.engine.config import EngineConfig
from corps.engine.exec.executor import Executor


@dataclass
class _Waiter:
    kind: str
    event: anyio.Event = field(default_factory=anyio.Event)
    ticket: int | None = None  # set when let in


class WorkflowGate:
    """`async with gate.enter(kind) as ticket: ...; ticket.used(tokens)`, or
    `ticket = await gate.admit(kind)` ... `gate.leave(ticket, kind, used)`."""

    def __init__(
        self,
        capacity: int | None,
        *,
        share: float = 0.9,
        first_guess: float = 0.1,
        used: Callable[[], int] | None = None,
        most: int | None = None,
    ) -> None:
        bad_capacity = capacity is not None and capacity < 1
        if bad_capacity or not 0 < share <= 1 or not 0 < first_guess <= 1:
            raise ValueError("capacity >= 1 or None, 0 < share <= 1, 0 < first_guess <= 1")
        if most is not None and most < 1:
            raise ValueError(f"most (workflows in at once) must be >= 1 or None, got {most}")
        self.capacity, self.share, self.first_guess = capacity, share, first_guess
        self.most = most  # workflows in at once, at most (None: as memory allows)
        self.used = used  # the store's tokens in use now (None: estimates only)
        self.peaks: dict[str, int] = {}  # the largest store tokens seen per kind
        self._in: dict[int, str] = {}  # ticket -> kind, of the workflows let in
        self._waiting: deque[_Waiter] = deque()
        self._waits: dict[int, float] = {}  # ticket -> s it waited, of those let in that waited
        self._tickets = 0
        self.waited = 0  # workflows that had to wait to start

    def estimate(self, kind: str) -> int:
        """Store tokens a workflow of `kind` is expected to hold at its peak (0 when
        the gate only counts)."""
        if self.capacity is None:
            return 0
        return self.peaks.get(kind, max(1, int(self.first_guess * self.capacity)))

    @property
    def running(self) -> int:
        """Workflows let in and not yet ended."""
        return len(self._in)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def committed(self) -> int:
        """Tokens the workflows let in are expected to hold at their peaks."""
        return sum(self.estimate(k) for k in self._in.values())

    def enter(self, kind: str) -> Ticket:
        """An async context manager: waits until a workflow of `kind` may start."""
        return Ticket(self, kind)

    def _fits(self, kind: str) -> bool:
        """Alone, or below `most` and its peak fits beside the peaks of those in, and
        the store has that much free now (what estimates miss: memory held outside
        any run)."""
        if not self._in:
            return True
        if self.most is not None and len(self._in) >= self.most:
            return False
        if self.capacity is None:
            return True
        if kind not in self.peaks and kind in self._in.values():
            return False  # one of a kind never seen to the end yet: it goes first, alone
        need, budget = self.estimate(kind), self.share * self.capacity
        if self.committed + need > budget:
            return False
        return self.used is None or self.used() + need <= budget

    def _let_in(self, kind: str) -> int:
        self._tickets += 1
        self._in[self._tickets] = kind
        return self._tickets

    async def admit(self, kind: str) -> int:
        """Wait until a workflow of `kind` may start; its ticket (give it to `leave`)."""
        if not self._waiting and self._fits(kind):
            return self._let_in(kind)
        waiter = _Waiter(kind)
        self._waiting.append(waiter)
        self.waited += 1
        arrived = anyio.current_time()
        try:
            await waiter.event.wait()
        except BaseException:  # cancelled: out of the line, or out of the gate
            if waiter.ticket is None:
                self._waiting.remove(waiter)
            else:
                self._in.pop(waiter.ticket, None)
            self._wake()
            raise
        self._waits[waiter.ticket] = anyio.current_time() - arrived
        return waiter.ticket

    def wait_of(self, ticket: int) -> float:
        """Seconds the workflow of `ticket` (in now) waited to be let in; 0 if it did not."""
        return self._waits.get(ticket, 0.0)

    def leave(self, ticket: int, kind: str, used: int = 0) -> None:
        """The workflow of `ticket` ended holding `used` store tokens at its peak (0: it
        failed, learn nothing); let in whoever fits now."""
        self._in.pop(ticket, None)
        self._waits.pop(ticket, None)
        if used > 0:
            self.peaks[kind] = max(self.peaks.get(kind, 0), used)
        self._wake()

    def _wake(self) -> None:
        """Let in, in arrival order, every waiting workflow that fits now."""
        while self._waiting and self._fits(self._waiting[0].kind):
            head = self._waiting.popleft()
            head.ticket = self._let_in(head.kind)
            head.event.set()


class Ticket:
    """A workflow's pass through the gate; `used(tokens)` notes what it holds."""

    def __init__(self, gate: WorkflowGate, kind: str) -> None:
        self.gate, self.kind = gate, kind
        self.peak = 0
        self._id: int | None = None

    def used(self, tokens: int) -> None:
        self.peak = max(self.peak, tokens)

    async def __aenter__(self) -> Ticket:
        self._id = await self.gate.admit(self.kind)
        return self

    async def __aexit__(self, exc_type: object, *exc: object) -> None:
        if self._id is not None:  # a failed workflow's peak says little: not learned
            self.gate.leave(self._id, self.kind, self.peak if exc_type is None else 0)


def gate_for(executor: Executor, cfg: EngineConfig) -> WorkflowGate | None:
    """The workflow gate for these settings: by memory where there is a store and
    `admission` is on, by count where `max_workflows` is set; None for neither."""
    capacity = executor.gauges()[1] if cfg.admission else 0
    if not capacity and cfg.max_workflows is None:
        return None
    used = (lambda: executor.gauges()[0]) if capacity else None
    return WorkflowGate(capacity or None, used=used, most=cfg.max_workflows)
