"""Submitting calls: every path goes through the guard and pins its parents.

A call's request is checked (access, leak policy; re-encodings made first under
"reencode"), its parents pinned so a `free` in between waits for it, and it is
queued to the batching loop as a `Job`. When the job ends its pins go back, a
result nobody will receive is freed, and its message gets its figures.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any
from weakref import WeakKeyDictionary

import anyio

from corps.cache.handle import Handle, bind
from corps.cache.messages import Message
from corps.engine.api.access import Guard
from corps.engine.api.audit import Auditor
from corps.engine.api.pending import Pending
from corps.engine.api.stream import StreamCalls, TextStream
from corps.engine.api.turns import Turns
from corps.engine.errors import EngineBusy
from corps.engine.exec.executor import Executor
from corps.engine.request.requests import DecodeRequest, PrefillRequest, decode_request
from corps.engine.request.workflow import CURRENT, Workflow
from corps.engine.sched.call_events import queued_event
from corps.engine.sched.job import Job
from corps.engine.sched.scheduler import Scheduler
from corps.engine.trace.events import Recorder

Request = PrefillRequest | DecodeRequest


def deduce_objective(
    asked: str | None, wf: Workflow | None, size: int, deduce: bool = True
) -> tuple[str, bool]:
    """A call's (objective, critical): its own objective (or its agent's) if given;
    else its workflow's ("throughput" outside any). A latency call is critical (it
    bounds the batch beside it, `objective` policy) unless it came in a task group
    of two or more of a latency workflow and `deduce`: Parrot's deduction, with
    what is known when the call arrives (a workflow's later calls are not): the
    calls made alone (a workflow's last steps and what they wait on) are
    latency-critical, and a group (a map stage, proposals, voters) is scheduled
    for its completion, admitted whole at a latency workflow's priority with the
    batch left open."""
    if asked is not None:
        return asked, asked == "latency"
    objective = wf.objective if wf is not None else "throughput"
    if objective != "latency":
        return objective, False
    return objective, not (deduce and size >= 2)


class Submitter:
    """Turns an engine's requests into queued, pinned, checked jobs."""

    def __init__(
        self, executor: Executor, sched: Scheduler, guard: Guard, recorder: Recorder
    ) -> None:
        self.executor, self.sched, self.guard, self.recorder = executor, sched, guard, recorder
        self.ids = itertools.count(1)  # call ids in traces
        self.deduce = True  # deduce which calls of a latency workflow are critical
        self.auditor: Auditor | None = None  # settles repairs and audits (the engine's)
        self.turns: Turns | None = None  # EngineConfig.store: recorded runs (`api.turns`)
        self._places: WeakKeyDictionary[Job, tuple] = WeakKeyDictionary()  # to record

    def stream(self, request: DecodeRequest) -> TextStream:
        """A decode whose text deltas are iterated as they are decoded (`Engine.stream`)."""
        sched, ex = self.sched, self.executor
        calls = StreamCalls(ex.fmt, self.job, sched.submit, self.wait, sched.end, ex.free)
        return TextStream(request, calls)

    def decode_request(self, args: Mapping[str, Any] | DecodeRequest) -> DecodeRequest:
        """The request, its constraint (if any) compiled now: a bad regex, schema or
        grammar raises InvalidConstraint here, before anything is queued or encoded."""
        request = decode_request(args)
        if request.sampling.constraint is not None:
            self.executor.grammars.compile(request.sampling.constraint)
        return request

    async def job(
        self, request: Request, cid: int | None = None, group: int | None = None, size: int = 1,
        *, replay: bool = True,
    ) -> Job:  # fmt: skip
        """Check access and the leak policy, re-encode if needed, pin parents: a Job
        (in task group `group` of `size` calls, else a group of its own). Inside a
        recorded run (`replay`), a call recorded before comes with its message."""
        cid = cid or next(self.ids)
        place = self.turns.begin(request) if self.turns is not None and replay else None
        request, missing, leaks = self.guard.screen(request, call_id=cid)
        if missing:
            request = await self.guard.reencode(request, self._prefill_internal)
            place = None  # it read fresh copies: not the calls a run recorded
        return self._job_at(place, request, cid, leaks, group, size)

    def _job_at(
        self, place: tuple | None, request: Request, cid: int, leaks: int,
        group: int | None = None, size: int = 1,
    ) -> Job:  # fmt: skip
        """A screened call's job: inside a recorded run (`place`), the message recorded
        for it before if there is one (a replayed job, `corps.engine.api.turns`), else
        a pinned job whose message is recorded when it is waited for."""
        replayed = None if place is None else self.turns.replay(place, request.owner)
        if replayed is not None:
            return Job(request, id=cid, handle=replayed, leaks=leaks, replayed=True)
        job = self.pinned_job(request, cid, group, size)
        job.leaks = leaks
        if place is not None:
            self._places[job] = place
        return job

    async def wait(self, job: Job) -> Handle:
        """The job's handle (`Scheduler.wait`), its call recorded in its run if it ran
        inside one (`corps.engine.api.turns`)."""
        handle = await self.sched.wait(job)
        place = self._places.pop(job, None)
        if place is not None and self.turns is not None:
            self.turns.record(place, handle)
        return handle

    def pinned_job(self, request, cid: int, group: int | None = None, size: int = 1) -> Job:
        """A job whose parents are pinned from now until it ends: a `free` in between
        waits for it instead of failing it. `cid` is its call id in traces; `size`
        the calls of its task group (`deduce_objective`)."""
        pins = self.executor.pin(request.parents)
        try:
            return self.job_of(request, cid, pins, group, size)
        except BaseException:
            self.executor.unpin(pins)
            raise

    def job_of(
        self, request, cid: int, pins: list[Message], group: int | None = None, size: int = 1
    ) -> Job:
        """A job holding `pins` (its parents, pinned), its repair settled and its audit
        decided (`corps.engine.api.audit`); the scheduler unpins them when it ends."""
        wf = CURRENT.get()
        request, auto = (
            (request, False) if self.auditor is None else self.auditor.resolve(request, wf)
        )
        objective, critical = deduce_objective(request.objective, wf, size, self.deduce)
        job = Job(
            request, id=cid, workflow=wf, objective=objective, critical=critical,
            group=group or cid,
        )  # fmt: skip
        job.pins = pins  # the scheduler unpins them when the job ends (`Scheduler.end`)
        if self.recorder.on:
            self.recorder.emit(queued_event(self.recorder, job))
        if self.auditor is not None:
            self.auditor.enlist(job, auto)
        return job

    def shadow_job(self, request: PrefillRequest, pins: list[Message]) -> Job:
        """An internal call (an audit's shadow) that takes over `pins`, unscreened: its
        reader already read these parents."""
        return self.job_of(request, next(self.ids), pins)

    async def _prefill_internal(self, request: PrefillRequest) -> Handle:
        return await self.run(self.pinned_job(request, next(self.ids)))

    async def run(self, job: Job) -> Handle:
        try:
            await self.sched.submit(job)
        except BaseException:
            self.sched.end(job)  # never queued: give its pins back
            raise
        return bind(await self.wait(job), job.request.owner)

    async def run_all(self, requests: list[Request]) -> list[Handle]:
        return [handle for handle, _ in await self.run_jobs(requests)]

    async def run_jobs(
        self, requests: list[Request], *, want_logits: bool = False
    ) -> list[tuple[Handle, Job]]:
        """Queue `requests` together (one step while there is room) and wait for all:
        each handle with its job (whose call holds its logits if `want_logits`). All
        or nothing: one failure cancels the others and frees what they made."""
        jobs: list[Job] = []
        queued = 0
        try:
            group = None  # one task group: the first call's id
            for request in requests:
                # a scored call (want_logits) runs: its logits are what it is for
                job = await self.job(
                    request, group=group, size=len(requests), replay=not want_logits
                )
                jobs.append(job)
                jobs[-1].want_logits = want_logits
                group = jobs[0].id
            for job in jobs:  # no yield between them while there is room: one step
                try:
                    self.sched.submit_nowait(job)
                except EngineBusy:
                    await self.sched.submit(job)
                queued += 1
            return [(bind(await self.wait(job), job.request.owner), job) for job in jobs]
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._undo(jobs, queued)
            raise

    async def _undo(self, jobs: list[Job], queued: int) -> None:
        """Cancel every job of a failed *_many call and free what they made."""
        for job in jobs:
            job.cancelled = True
        for job in jobs[queued:]:
            self.sched.end(job)
        for job in jobs[:queued]:
            await job.abandon()  # the loop aborts cancelled jobs at its next step
        for job in jobs:
            if job.handle is not None and not job.replayed:  # a replayed one made nothing
                self.executor.free(job.handle)
                job.handle = None

    def submit_nowait(self, request: Request) -> Pending:
        cid = next(self.ids)
        place = self.turns.begin(request) if self.turns is not None else None
        request, missing, leaks = self.guard.screen(request, call_id=cid)
        if missing:  # re-encodings must run first: queue the call when awaited
            return Pending(self.job(request, cid, replay=False), self.run, self.wait)
        job = self._job_at(place, request, cid, leaks)
        try:
            self.sched.submit_nowait(job)
        except BaseException:
            self.sched.end(job)
            raise
        return Pending(job, self.run, self.wait)
