"""`Job`: one call waiting for, or running in, the batching loop, and its waiter."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from corps.cache.handle import Handle
from corps.cache.messages import CallFigures, Message
from corps.engine.errors import CallCancelled
from corps.engine.exec.call import Call
from corps.engine.exec.step_plan import next_rows
from corps.engine.request.workflow import Workflow


@dataclass(eq=False)
class Job:
    """One call waiting for, or running in, the loop.

    Callbacks run on the event loop. If `on_token` or `on_done` raises, that call
    alone fails with the callback's exception (its message is freed); the loop
    goes on. The scheduler ends a job (`Scheduler.end`): the parents it pinned go
    back, a message nobody will receive is freed, and its waiter wakes.
    """

    request: Any
    want_logits: bool = False
    keep: int = 0  # an audited decode: positions whose distribution it keeps (`Call.kept`)
    on_token: Callable[[int], None] | None = None  # each sampled token
    on_done: Callable[[], None] | None = None  # when the job ends, before its waiter wakes
    pins: list[Message] = field(default_factory=list)  # parents pinned until it ends
    done: anyio.Event = field(default_factory=anyio.Event)
    handle: Handle | None = None
    error: BaseException | None = None
    call: Call | None = None
    cancelled: bool = False
    submitted: float = field(default_factory=time.perf_counter)
    admitted: float | None = None  # when its first step began
    first_token: float | None = None
    id: int = 0  # the engine's call id (traces)
    leaks: int = 0  # leaks the guard recorded for this call
    # what scheduling policies read (corps.engine.sched.policies, corps.engine.request.workflow)
    workflow: Workflow | None = None  # the workflow it was made in
    objective: str = "throughput"
    # a latency call that bounds the batch while it runs (`objective` policy): one made
    # alone, or asked latency itself; a task group of a latency workflow is latency
    # (admitted first) but not critical: the group's completion is what counts
    critical: bool = False
    group: int = 0  # its task group: calls submitted together (its own id alone)
    skipped: int = 0  # steps in a row the policy left it out of (`objective`)
    charged: int = 0  # of its call's encoded tokens, those already counted (`fair`)
    # it came with its message, made by an earlier run (`corps.engine.api.turns`): it
    # never runs, and nothing that ends it frees that message
    replayed: bool = False

    @property
    def rows(self) -> int:
        """Rows the call brings to its next step (`step_plan.next_rows`, the plan's own
        formula; policies bound steps by it); 1 before it is admitted."""
        return 1 if self.call is None else max(1, next_rows(self.call))

    @property
    def keys(self) -> int:
        """Keys the call attends over in its next step when that step is one row
        (`Call.next_keys`; 0 before it is admitted)."""
        return 0 if self.call is None else self.call.next_keys

    def figures(self) -> CallFigures:
        """What this call cost (its message keeps it: `Handle.tokens_encoded`, ...)."""
        call = self.call
        ttft = self.first_token - self.submitted if self.first_token is not None else None
        return CallFigures(
            tokens_encoded=call.encoded if call is not None else 0,
            tokens_reused=call.reused if call is not None else 0,
            tokens_repaired=call.repaired if call is not None else 0,
            tokens_repair_cut=call.repair.cut if call is not None and call.repair else 0,
            ttft_s=ttft,
            leaks=self.leaks,
        )

    def run_on_done(self) -> None:
        """Run `on_done` once, as the job ends; its error becomes the job's."""
        if self.on_done is not None:
            on_done, self.on_done = self.on_done, None
            try:
                on_done()
            except Exception as exc:
                self.error = self.error or exc

    async def abandon(self) -> None:
        """Cancel the job and wait until the loop has ended it: between steps it
        aborts the call (its partial tokens rolled back, its slots and pins given
        back), or ends it with the engine (`close`). Shielded, so that a caller
        leaving a call by cancellation leaves the store as it was when it returns.
        The job must have been submitted (the loop is what ends it)."""
        self.cancelled = True
        with anyio.CancelScope(shield=True):
            await self.done.wait()

    def token(self, tok: int) -> None:
        """Pass a sampled token to `on_token`; a callback error fails this job only."""
        if self.on_token is None or self.cancelled:
            return
        try:
            self.on_token(tok)
        except Exception as exc:
            self.error, self.cancelled = exc, True  # aborted before the next step

    async def wait(self) -> Handle:
        """The handle, or the job's error; cancelling the wait cancels the job and
        returns once the loop has ended it (`abandon`; a handle it finished with
        meanwhile is the waiter's to free: `Scheduler.wait`)."""
        try:
            await self.done.wait()
        except BaseException:
            await self.abandon()
            raise
        if self.error is not None:
            raise self.error
        if self.handle is None:  # cancelled (Pending.cancel) before it finished
            raise CallCancelled("this call was cancelled before it finished; it left no message")
        return self.handle


def service(chosen: list[Job], out) -> list[tuple[Job, int]]:
    """What a step gave each of its jobs (`fair`): the tokens its call encoded since
    last counted, plus the tokens it sampled."""
    sampled: dict[Call, int] = {}
    for call, _ in out.tokens:
        sampled[call] = sampled.get(call, 0) + 1
    work = []
    for job in chosen:
        encoded = job.call.encoded
        work.append((job, max(0, encoded - job.charged) + sampled.get(job.call, 0)))
        job.charged = encoded
    return work
