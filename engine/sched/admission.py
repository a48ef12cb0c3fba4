"""Admission: waiting calls taken into the running set, as the policy orders them.

Head of line, a task group at a time: a group whose memory cannot be had now
waits (with every group behind it) while running calls may give memory back; if
nothing running could, it evicts encodings no call reads, in the policy's victim
order, and fails with CacheFullError only if that cannot make room either. A
group is admitted whole or not at all (the calls it got are given back). A call
that fails here (bad input, a store too small for it) ends in `finished` with
its error; one whose prompt shares an uncached prefix with a running call's
(baseline) is held until that prefix is encoded.
"""

from __future__ import annotations

from corps.cache.errors import CacheFullError, StoreTooSmall
from corps.engine.exec.call import Call
from corps.engine.exec.executor import Executor
from corps.engine.sched.job import Job
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
        self.running: list[Job] = []
        self.held: list[Job] = []
        self.finished: list[Job] = []
        self.job_of: dict[Call, Job] = {}  # each running job by its call

    def enter(self, job: Job, call: Call, t0: float) -> None:
        """`job` runs as `call` from now (admitted at t0); the pins it took on its parents
        at submission go with it (`Call.pins`: given back when the call ends, in exec; a
        job made without them was admitted with the call pinning its parents itself)."""
        job.call, job.admitted = call, t0
        if job.pins:
            call.pins, job.pins = job.pins, []
        self.running.append(job)
        self.job_of[call] = job

    def leave(self, job: Job) -> None:
        """`job` no longer runs (its call ended or was aborted)."""
        self.running.remove(job)
        del self.job_of[job.call]

    def clear(self) -> None:
        """Nothing runs, waits or is finished any more (the loop shut down)."""
        self.running, self.held, self.finished, self.job_of = [], [], [], {}

    def _call(self, job: Job, alone: bool):
        """`executor.admit` for one job; if the store is full and nothing running will give
        memory back (`alone`), again with eviction in the policy's order."""
        try:
            return self.executor.admit(
                job.request,
                want_logits=job.want_logits,
                keep=job.keep,
                hold=True,
                pinned=bool(job.pins),
            )
        except CacheFullError as exc:
            if not alone or not self.evict or isinstance(exc, StoreTooSmall):
                raise
        return self.executor.admit(
            job.request, want_logits=job.want_logits, keep=job.keep, hold=True,
            evict=self.policy.victims, pinned=bool(job.pins),
        )  # fmt: skip

    def admit(self, arrived: list[Job], t0: float) -> None:
        """Admit waiting jobs as the policy orders them, a task group at a time.

        Admission is head of line: a group whose memory cannot be had now waits
        (with every group behind it) while running calls may give memory back; if
        nothing is running that could, it evicts encodings no call reads (`evict`),
        and fails with CacheFullError only if that cannot make room either. A group
        is admitted whole or not at all (the calls it got are given back).
        """
        self.held = []
        live = []
        for job in arrived:
            (self.finished if job.cancelled else live).append(job)
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

    def _fitting(self, groups: list[list[Job]]) -> list[list[Job]]:
        """Groups as the policy gave them, a group larger than max_running one by one."""
        out: list[list[Job]] = []
        for group in groups:
            out += [[j] for j in group] if len(group) > self.max_running else [group]
        return out

    def _group(self, group: list[Job], t0: float) -> bool:
        """Admit every job of `group`; False if it must wait for memory (held whole)."""
        taken: list[Job] = []
        for job in group:
            try:
                call = self._call(job, alone=not (self.running or taken))
            except CacheFullError as exc:
                if isinstance(exc, StoreTooSmall) or not (self.running or taken):
                    job.error = exc  # could never fit, or nothing running will make room
                    self.finished.append(job)
                    continue
                for other in taken:  # the group waits whole: give back what it got
                    self.leave(other)
                    other.pins, other.call.pins = other.call.pins, []  # still queued
                    self.executor.abort(other.call)
                    other.call = other.admitted = None
                self.held += [j for j in group if j not in self.finished]
                return False
            except Exception as exc:  # bad input fails this job only
                job.error = exc
                self.finished.append(job)
                continue
            if call is None:  # its prompt's prefix is being encoded: reuse it next step
                self.held.append(job)
                continue
            self.enter(job, call, t0)
            taken.append(job)
        return True
