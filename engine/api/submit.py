"""Submitting calls: every path goes through the guard and pins its parents.

A call's request is checked (access, leak policy; re-encodings made first under
"reencode") and becomes its `Call` record (`Call.queued`), its parents pinned so a
`free` in between waits for it, and it is queued to the batching loop. When the
call ends its pins go back, a result nobody will receive is freed, and its message
gets its figures.
"""

from __future__ import annotations

import itertools
import time
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
from corps.engine.exec.call import Call
from corps.engine.exec.executor import Executor
from corps.engine.request.requests import DecodeRequest, PrefillRequest, decode_request
from corps.engine.request.workflow import CURRENT, Workflow
from corps.engine.sched.call_events import queued_event
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
    """Turns an engine's requests into queued, pinned, checked calls."""

    def __init__(
        self, executor: Executor, sched: Scheduler, guard: Guard, recorder: Recorder
    ) -> None:
        self.executor, self.sched, self.guard, self.recorder = executor, sched, guard, recorder
        self.ids = itertools.count(1)  # call ids in traces
        self.deduce = True  # deduce which calls of a latency workflow are critical
        self.auditor: Auditor | None = None  # settles repairs and audits (the engine's)
        self.turns: Turns | None = None  # EngineConfig.store: recorded runs (`api.turns`)
        self._places: WeakKeyDictionary[Call, tuple] = WeakKeyDictionary()  # to record

    def stream(self, request: DecodeRequest) -> TextStream:
        """A decode whose text deltas are iterated as they are decoded (`Engine.stream`)."""
        sched, ex = self.sched, self.executor
        calls = StreamCalls(ex.fmt, self.call, sched.submit, self.wait, sched.end, ex.free)
        return TextStream(request, calls)

    def decode_request(self, args: Mapping[str, Any] | DecodeRequest) -> DecodeRequest:
        """The request, its constraint (if any) compiled now: a bad regex, schema or
        grammar raises InvalidConstraint here, before anything is queued or encoded."""
        request = decode_request(args)
        if request.sampling.constraint is not None:
            self.executor.grammars.compile(request.sampling.constraint)
        return request

    async def call(
        self, request: Request, cid: int | None = None, group: int | None = None, size: int = 1,
        *, replay: bool = True,
    ) -> Call:  # fmt: skip
        """Check access and the leak policy, re-encode if needed, pin parents: a queued
        Call (in task group `group` of `size` calls, else a group of its own). Inside a
        recorded run (`replay`), a call recorded before comes with its message."""
        call, place, dirty = self._screened(request, cid, replay)
        if dirty:  # parents that need a clean copy first
            call.request = await self.guard.reencode(call.request, self._prefill_internal)
            place = None  # it read fresh copies: not the calls a run recorded
        return self._settle(call, place, group, size)

    def _screened(
        self, request: Request, cid: int | None = None, replay: bool = True
    ) -> tuple[Call, tuple | None, bool]:
        """The request's record, its place in a recorded run (if `replay`), and whether
        the guard found parents that need a clean copy first (`Guard.screen`)."""
        call = Call.queued(request, id=cid or next(self.ids))
        place = self.turns.begin(request) if self.turns is not None and replay else None
        return call, place, bool(self.guard.screen(call))

    def _settle(
        self, call: Call, place: tuple | None = None, group: int | None = None, size: int = 1
    ) -> Call:
        """A screened call made ready to queue: inside a recorded run (`place`), the
        message recorded for it before if there is one (a replayed call,
        `corps.engine.api.turns`); else its parents pinned from now until it ends (a
        `free` in between waits for it), the rest settled (`_ready`), and its message
        recorded when it is waited for."""
        replayed = None if place is None else self.turns.replay(place, call.request.owner)
        if replayed is not None:
            call.handle, call.replayed = replayed, True
            return call
        call.pins = self.executor.pin(call.request.parents)
        try:
            self._ready(call, group, size)
        except BaseException:
            pins, call.pins = call.pins, []
            self.executor.unpin(pins)
            raise
        if place is not None:
            self._places[call] = place
        return call

    async def wait(self, call: Call) -> Handle:
        """The call's handle (`Scheduler.wait`), recorded in its run if it ran inside
        one (`corps.engine.api.turns`)."""
        handle = await self.sched.wait(call)
        place = self._places.pop(call, None)
        if place is not None and self.turns is not None:
            self.turns.record(place, handle)
        return handle

    def _ready(self, call: Call, group: int | None = None, size: int = 1) -> None:
        """Settle a pinned call's repair, objective (`deduce_objective`: `size` the calls
        of its task group) and audit (`corps.engine.api.audit`); queued from now."""
        wf = CURRENT.get()
        auto = False
        if self.auditor is not None:
            call.request, auto = self.auditor.resolve(call.request, wf)
        call.workflow, call.group = wf, group or call.id
        objective = call.request.objective
        call.objective, call.critical = deduce_objective(objective, wf, size, self.deduce)
        call.submitted = time.perf_counter()  # (after any re-encoding it waited for)
        if self.recorder.on:
            self.recorder.emit(queued_event(self.recorder, call))
        if self.auditor is not None:
            self.auditor.enlist(call, auto)

    def shadow_call(self, request: PrefillRequest, pins: list[Message]) -> Call:
        """An internal call (an audit's shadow) that takes over `pins`, unscreened: its
        reader already read these parents."""
        call = Call.queued(request, id=next(self.ids), pins=pins)
        self._ready(call)
        return call

    async def _prefill_internal(self, request: PrefillRequest) -> Handle:
        return await self.run(self._settle(Call.queued(request, id=next(self.ids))))

    async def run(self, call: Call) -> Handle:
        try:
            await self.sched.submit(call)
        except BaseException:
            self.sched.end(call)  # never queued: give its pins back
            raise
        return bind(await self.wait(call), call.request.owner)

    async def run_all(self, requests: list[Request]) -> list[Handle]:
        return [handle for handle, _ in await self.run_calls(requests)]

    async def run_calls(
        self, requests: list[Request], *, want_logits: bool = False
    ) -> list[tuple[Handle, Call]]:
        """Queue `requests` together (one step while there is room) and wait for all:
        each handle with its call (which holds its logits if `want_logits`). All or
        nothing: one failure cancels the others and frees what they made."""
        calls: list[Call] = []
        queued = 0
        try:
            group = None  # one task group: the first call's id
            for request in requests:
                # a scored call (want_logits) runs: its logits are what it is for
                call = await self.call(
                    request, group=group, size=len(requests), replay=not want_logits
                )
                call.want_logits = want_logits
                calls.append(call)
                group = calls[0].id
            for call in calls:  # no yield between them while there is room: one step
                try:
                    self.sched.submit_nowait(call)
                except EngineBusy:
                    await self.sched.submit(call)
                queued += 1
            return [(bind(await self.wait(call), call.request.owner), call) for call in calls]
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._undo(calls, queued)
            raise

    async def _undo(self, calls: list[Call], queued: int) -> None:
        """Cancel every call of a failed *_many call and free what they made."""
        for call in calls:
            call.cancelled = True
        for call in calls[queued:]:
            self.sched.end(call)
        for call in calls[:queued]:
            await call.abandon()  # the loop aborts cancelled calls at its next step
        for call in calls:
            if call.handle is not None and not call.replayed:  # a replayed one made nothing
                self.executor.free(call.handle)
                call.handle = None

    def submit_nowait(self, request: Request) -> Pending:
        call, place, dirty = self._screened(request)
        if dirty:  # re-encodings must run first: queue it when awaited
            return Pending(self.call(call.request, call.id, replay=False), self.run, self.wait)
        call = self._settle(call, place)
        try:
            self.sched.submit_nowait(call)
        except BaseException:
            self.sched.end(call)
            raise
        return Pending(call, self.run, self.wait)
