"""Admission: waiting calls taken into the running set, as the policy orders them.

Head of line, a task group at a time: a group whose memory cannot be had now
waits (with every group behind it) while running calls may give memory back; if
nothing running could, it evicts encodings no call reads, in the policy's victim
order, and fails with CacheFullError only if that cannot make room either. A
group is admitted whole or not at all (the calls it got are given back). A call
that fails here (bad input, a store too small for it) ends in `finished` with
its error; one whose prompt shares an uncached prefix with a running call's
(baseline) is held until that prefix is encoded. Eviction takes what no
workflow's next step reads first, and once nothing waits, what they read comes
back from the disk tier ahead of them (`corps.engine.sched.next_reads`).
"""

from __future__ import annotations

from corps.cache.errors import CacheFullError, StoreTooSmall
from corps.engine.exec.call import Call
from corps.engine.exec.executor import Executor
from corps.engine.sched.next_reads import NextReads
from corps.engine.sched.policies import Policy


class Admission:
    """The running, held and finished calls of one loop, and how calls get in.

    `running`: admitted and stepping; `held`: waiting to be admitted again at the
    next step (behind a group that waits for memory, at the `max_running` cap, held
    back by the policy, or waiting for a shared prefix); `finished`: ended here or
    by their steps, to be woken by the loop."""

    def __init__(
        self, executor: Executor, policy: Policy, *, max_running: int, evict: bool
    ) -> None:
        self.executor, self.policy = executor, policy
        self.max_running, self.evict = max_running, evict
        self.running: list[Call] = []
        self.held: list[Call] = []
        self.finished: list[Call] = []
        self.next_reads = NextReads()  # what workflows' next steps read (`Engine.expect`)

    def leave(self, call: Call) -> None:
        """`call` no longer runs (it ended or was aborted)."""
        self.running.remove(call)

    def clear(self) -> None:
        """Nothing runs, waits or is finished any more (the loop shut down)."""
        self.running, self.held, self.finished = [], [], []

    def _admit(self, call: Call, alone: bool) -> bool:
        """`executor.admit` for one call (False: held for a prefix); if the store is full
        and nothing running will give memory back (`alone`), again with eviction in the
        policy's order."""
        try:
            return self.executor.admit(call, hold=True) is not None
        except CacheFullError as exc:
            if not alone or not self.evict or isinstance(exc, StoreTooSmall):
                raise
        order = self.next_reads.order(self.policy.victims)
        return self.executor.admit(call, hold=True, evict=order) is not None

    def admit(self, arrived: list[Call], t0: float) -> None:
        """Admit waiting calls as the policy orders them, a task group at a time.

        Admission is head of line: a group whose memory cannot be had now waits
        (with every group behind it) while running calls may give memory back; if
        nothing is running that could, it evicts encodings no call reads (`evict`),
        and fails with CacheFullError only if that cannot make room either. A group
        is admitted whole or not at all (the calls it got are given back).
        """
        self.held = []
        live = []
        for call in arrived:
            (self.finished if call.cancelled else live).append(call)
        blocked = False
        for group in self._fitting(self.policy.order(live, t0)):
            room = self.max_running - len(self.running)
            if blocked or (self.running and len(group) > room) or room <= 0:
                self.held += group  # behind a group waiting for memory, or at the cap
                continue
            if not self.policy.may_admit(group, self.running, live, t0):
                self.held += group
                continue
            blocked = not self._group(group, t0)
        if not self.held:  # nothing waits for room: bring back what next steps read
            self.next_reads.prefetch(self.executor)

    def _fitting(self, groups: list[list[Call]]) -> list[list[Call]]:
        """Groups as the policy gave them, a group larger than max_running one by one."""
        out: list[list[Call]] = []
        for group in groups:
            out += [[c] for c in group] if len(group) > self.max_running else [group]
        return out

    def _group(self, group: list[Call], t0: float) -> bool:
        """Admit every call of `group`; False if it must wait for memory (held whole)."""
        taken: list[Call] = []
        for call in group:
            try:
                admitted = self._admit(call, alone=not (self.running or taken))
            except CacheFullError as exc:
                if isinstance(exc, StoreTooSmall) or not (self.running or taken):
                    call.error = exc  # could never fit, or nothing running will make room
                    self.finished.append(call)
                    continue
                for other in taken:  # the group waits whole: give back what it got
                    self.leave(other)
                    self.executor.abort(other, keep_pins=True)  # still queued: its pins stay
                    other.unplan()
                    other.admitted = None
                self.held += [c for c in group if c not in self.finished]
                return False
            except Exception as exc:  # bad input fails this call only
                call.error = exc
                self.finished.append(call)
                continue
            if not admitted:  # its prompt's prefix is being encoded: reuse it next step
                self.held.append(call)
                continue
            call.admitted = t0
            self.running.append(call)
            taken.append(call)
        return True
