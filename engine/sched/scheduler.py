"""The batching loop: one task per engine fuses every concurrent call into shared steps.

Every `prefill` / `decode` becomes a `Call` (queued) on a bounded queue. Each iteration
the loop runs ONE fused forward step off the event loop, on the process's torch
thread (`corps.engine.exec.torch_thread` says why one): a next token for every
running decode plus prefill chunks for waiting calls. A step is three phases
(`_step_sync`): schedule (admission, the policy's order), run (forward and draw),
postprocess (errors, handles, tokens to their calls; ended ones to `finished`).

Run ahead: while nothing needs the event loop between two steps (no call ended,
failed, arrived, was held or cancelled; none streams its tokens), the torch
thread runs the next step at once, up to `run_ahead` steps a hop, and the loop
then does each one's bookkeeping in order (`_run_ahead` says exactly when). The
steps are those the loop would have run; only the hops between them are saved.

Policy (fairness): running decodes always get their token first; prefill
chunks (at most 512 tokens each, see `corps.engine.exec.step_plan`) fill the rest of the
per-step token budget in arrival order. A long prompt is thus spread over
several steps and delays the running decodes by at most one chunk per step;
it never starves them.

Failure isolation: a bad request or a sampling error fails its own call only.
If a step's forward raises, the calls in that step fail with the cause and the
loop keeps serving new ones. If the loop itself dies, every waiter fails with
the cause (`EngineClosed`), none hangs.

Prefix sharing (baseline mode): a call whose prompt shares a long uncached
prefix with a running call's prompt is held until that prefix is encoded and
cached (one step per 512-token chunk), then reuses it instead of encoding it
again, as SGLang does for requests that arrive together.

Preemption: a call that cannot get memory while nothing running could give
any back evicts the encodings of messages no running call reads, in the
policy's order (`Policy.victims`); they are recomputed when read again
(`corps.engine.exec.memory`, `corps.engine.exec.restorer`).

Successors: after a step that ended a latency-critical call, the loop lets the
event loop run a few turns (bounded in turns, never in time) before the next
step, so that the workflow's next call, usually made at once, is in it.

Cancellation: a cancelled waiter marks its call; between steps the loop aborts it
(its partial tokens rolled back, its slots freed). `close` aborts every call (EngineClosed).
"""

from __future__ import annotations

import time

import anyio
import anyio.lowlevel

from corps.cache.handle import Handle
from corps.engine.config import RUN_AHEAD
from corps.engine.errors import EngineBusy, EngineClosed
from corps.engine.exec.call import Call
from corps.engine.exec.executor import Executor
from corps.engine.exec.step_plan import StepOutput, StepPlan
from corps.engine.exec.torch_thread import TORCH, TorchThread
from corps.engine.sched.admission import Admission
from corps.engine.sched.call_events import end_events
from corps.engine.sched.policies import Fcfs, Policy, started
from corps.engine.sched.step import plan_step, service
from corps.engine.sched.stepped import Counters, step_event
from corps.engine.trace.events import ErrorEvent, FirstToken, Recorder

#: Event-loop turns the idle loop waits for more arrivals before its first step, and
#: the loop waits after a step that ended a latency-critical call (for its successor).
GATHER_TURNS = 8


class Scheduler:
    def __init__(
        self,
        executor: Executor,
        *,
        queue_size: int = 256,
        step_tokens: int = 512,
        recorder: Recorder | None = None,
        max_running: int = 256,
        policy: Policy | None = None,
        evict: bool = True,
        thread: TorchThread = TORCH,
        run_ahead: int = RUN_AHEAD,
    ) -> None:
        if min(queue_size, step_tokens, max_running, run_ahead) < 1:
            raise ValueError("queue_size, step_tokens, max_running and run_ahead must be >= 1")
        self.policy: Policy = policy or Fcfs()
        self.executor = executor
        # preemption: a call nothing running could make room for may evict encodings
        # no running call reads, in the policy's order (False: it fails, CacheFullError)
        self.admission = Admission(executor, self.policy, max_running=max_running, evict=evict)
        self.thread = thread  # runs every step (corps.engine.exec.torch_thread says why one)
        self.rec = recorder or Recorder()
        self.step_tokens = step_tokens
        self.run_ahead = run_ahead  # steps run back to back on the torch thread, at most
        self.queue_size = queue_size
        self._send, self._recv = anyio.create_memory_object_stream[Call](queue_size)
        self._incoming: list[Call] = []
        self._linger = False  # the last step ended a critical call: wait for its successor
        self._closing = False
        self._dead: BaseException | None = None
        self.started = False
        self.n = Counters()
        self._preempted = (0, 0)  # the executor's (evicted, recomputed) at the last step event
        self._stepped = anyio.Event()  # set as each step ends (`stepped`)
        self._stopped = False  # the loop ended: `stepped` returns False from now on

    async def submit(self, call: Call) -> None:
        """Queue `call`, waiting for room only when the queue is full. With room it is
        queued at once, with no yield first: a yield lets the loop plan its next step
        without a call that was already made (and traced as queued). A call that comes
        with its message (a recorded call replayed, `corps.engine.api.turns`) ends now."""
        self._check_open()
        if call.replayed:
            return self.end(call)
        try:
            self._send.send_nowait(call)
            return
        except anyio.WouldBlock:
            pass
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise self._closed_error() from None
        try:
            await self._send.send(call)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise self._closed_error() from None

    def submit_nowait(self, call: Call) -> None:
        self._check_open()
        try:
            if call.replayed:  # as `submit`
                return self.end(call)
            self._send.send_nowait(call)
        except anyio.WouldBlock:
            raise EngineBusy(
                f"engine queue full ({self.queue_size} calls waiting); await the call instead "
                f"of the _nowait form, or open the engine with a larger queue_size"
            ) from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise self._closed_error() from None

    @property
    def idle(self) -> bool:  # no call queued, held or running
        return not self.admission.running and not self.admission.held and self.queue_depth() == 0

    def queue_depth(self) -> int:
        return self._send.statistics().current_buffer_used

    @property
    def accepting(self) -> bool:  # calls may be submitted now: started, not closing or crashed
        return self.started and not self._closing and self._dead is None

    def _check_open(self) -> None:
        if not self.accepting:
            raise self._closed_error()

    def _closed_error(self) -> EngineClosed:
        if self._dead is not None:
            return EngineClosed(f"the engine's loop crashed: {self._dead!r}")
        if not self.started:
            return EngineClosed(
                "engine not started: use `async with Engine.open(...) as engine` "
                "(or `async with engine:` after Engine.load)"
            )
        return EngineClosed("the engine is shut down")

    async def stepped(self) -> bool:
        """Wait for the end of the next step: True, or False once the loop has stopped
        (for the engine's own bookkeeping between steps; the loop calls nothing back)."""
        if not self._stopped:
            await self._stepped.wait()
        return not self._stopped

    # ---- ending calls (event loop) ----

    def end(self, call: Call) -> None:
        """End a call once: its `on_done`, the pins it still holds given back (one never
        admitted; a call that ran gave them back as it ended), a message nobody will
        receive (it failed or was cancelled) freed, its figures kept on its message,
        its trace events, then its waiter woken."""
        if call.ended.is_set():
            return
        call.run_on_done()
        executor = self.executor
        if call.pins:
            pins, call.pins = call.pins, []
            executor.unpin(pins)
        made = call.handle is not None and not call.replayed
        if made and (call.error or call.cancelled):
            executor.free(call.handle)  # finished, but nobody will ever receive it
            call.handle = made = None
        if made:
            executor.table.get(call.handle.id).figures = call.figures()
        if self.rec.on:
            for event in end_events(self.rec, executor.table, call):
                self.rec.emit(event)
        call.ended.set()

    async def wait(self, call: Call) -> Handle:
        """The call's handle, or its error (`Call.wait`); a waiter cancelled after the
        call finished frees what it made, since nobody will receive it."""
        try:
            return await call.wait()
        except BaseException:
            if call.ended.is_set() and call.handle is not None and not call.replayed:
                handle, call.handle = call.handle, None
                self.executor.free(handle)
            raise

    # ---- the loop ----

    async def run(self) -> None:
        """The loop task. Returns after close(); fails every waiter if it dies."""
        self.started = True
        try:
            while not self._closing:
                new = await self._collect()
                if new is None:
                    break
                self._reap_cancelled()
                if new or self.admission.running or self.admission.held:
                    await self._step(new)
                del new  # while it waits for calls, the loop keeps none it ran alive
        except Exception as exc:  # the loop itself died: every waiter learns why
            self._dead = exc
            if self.rec.on:
                self.rec.emit(ErrorEvent(t=self.rec.now(), where="engine loop", detail=repr(exc)))
        finally:
            self._shut_down()

    async def close(self) -> None:
        """Stop taking calls; queued and running ones fail with EngineClosed."""
        self._closing = True
        await self._send.aclose()

    async def _collect(self) -> list[Call] | None:
        """New calls: wait for one when idle, else take what is queued. None once closed.

        Waking from idle, the loop lets the event loop run a few more turns while
        calls keep arriving (tasks that submit together, e.g. agents asked at
        once, are a few hops away), so they start in the same step instead of
        the first one running alone. Bounded in turns, never in time.
        """
        new: list[Call] = []
        if not self.admission.running and not self.admission.held:
            try:
                new.append(await self._recv.receive())
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                return None
            for _ in range(GATHER_TURNS):
                await anyio.lowlevel.checkpoint()
                if not self._drain(new):
                    break
        elif self._linger:
            # a critical call just ended: its workflow's next call (a chat's reply after
            # its prompt, an agent's next turn) is a few hops away; without this wait the
            # next step starts without it, unbounded, and it waits that whole step
            for _ in range(GATHER_TURNS):
                await anyio.lowlevel.checkpoint()
                if self._drain(new):
                    break
        self._linger = False
        self._drain(new)
        return new

    def _drain(self, new: list[Call]) -> int:
        """Move every queued call into `new`; how many there were."""
        n = 0
        while True:
            try:
                new.append(self._recv.receive_nowait())
                n += 1
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                return n

    def _reap_cancelled(self) -> None:
        for call in [c for c in self.admission.running if c.cancelled]:
            self.executor.abort(call)
            self.admission.leave(call)
            self.end(call)

    async def _step(self, new: list[Call]) -> None:
        """One hop to the torch thread: a step, and the steps it ran ahead after it
        (`_run_ahead`); then each one's bookkeeping in order, and the calls they ended."""
        t0 = time.perf_counter()
        self._incoming = new  # owned by the loop until the step has taken them
        ran = await self.thread.run(self._steps_sync, new, t0)
        self._incoming = []
        ran[-1].end = time.perf_counter()  # the last step ends as the loop takes it back
        for s in ran:
            self._account(s)
        # who waits for the step's end (the engine's sweep of dead handles) runs before
        # the waiters of the calls it ended: an event's waiters wake in the order set
        self._stepped.set()
        self._stepped = anyio.Event()
        for call in self.admission.finished:
            self.end(call)
        critical = self.policy.is_critical
        self._linger = any(critical(c) and c.error is None for c in self.admission.finished)
        self.admission.finished = []

    def _account(self, s: StepOutput) -> None:
        """A step's figures, its tokens handed to their calls, its trace event."""
        n, rec, wall = self.n, self.rec, s.end - s.t0
        n.step_seconds += wall
        if s.encoded:
            n.encode_seconds += wall
        n.forward_seconds += s.forward_s
        if s.ran and not s.fed_back:  # what the step's calls waited, for the policy
            self.policy.stepped(wall)
        for call, tok in s.tokens:
            if not call.emitted:  # its first token (hf mode knows when generate made it)
                call.first_token = call.first_token or s.end
                n.ttft_sum += call.first_token - call.submitted
                n.ttft_n += 1
                if rec.on:
                    rec.emit(FirstToken(t=rec.rel(call.first_token), call=call.id))
            call.emitted += 1
            if rec.tokens:
                rec.token(call.id, tok)
            call.token(tok)
        n.tokens_sampled += len(s.tokens)
        if rec.on and s.ran:
            event, self._preempted = step_event(s, rec.rel(s.t0), self._preempted)
            rec.emit(event)

    def _steps_sync(self, new: list[Call], t0: float) -> list[StepOutput]:
        """Torch thread: a step, then up to `run_ahead` - 1 more while `_run_ahead`
        says nothing needs the event loop between them."""
        ran = [self._step_sync(new, t0)]
        while len(ran) < self.run_ahead and self._run_ahead(ran[-1]):
            last = ran[-1]
            if last.ran:  # its feedback before the next step is planned, as the loop gives it
                self.policy.stepped(last.end - last.t0)
                last.fed_back = True
            ran.append(self._step_sync([], last.end))
        return ran

    def _run_ahead(self, last: StepOutput) -> bool:
        """Whether the next step may follow `last` on the torch thread at once, without
        the event loop between them. It may while the loop would do nothing there but
        hand over tokens nobody waits for one by one: no call ended or failed, none is
        held, queued or cancelled, none streams its tokens (`on_token`), no recording
        of single tokens, the engine is not closing, and no other work waits for the
        torch thread (another engine's step takes its turn). The tokens and figures of the
        steps run ahead reach the loop after the last of them, each with its own times
        (TTFT, the trace's step events); the steps themselves are the ones the loop
        would have run (a call made meanwhile is queued, which ends the run ahead)."""
        running = self.admission.running
        return (
            last.ran
            and bool(running)
            and not (self.admission.finished or self.admission.held or last.failed)
            and not self._closing
            and not self.rec.tokens
            and self.queue_depth() == 0
            and not self.thread.waiting
            and not any(c.cancelled or c.on_token is not None for c in running)
        )

    def _step_sync(self, new: list[Call], t0: float) -> StepOutput:
        """Torch thread: one step, as schedule (admission included), run, postprocess."""
        chosen, order, admit_s = self._schedule(new, t0)
        out = self._run(chosen, order) if chosen or order.ready else StepOutput(ran=False)
        self._postprocess(out)
        return self._recorded(out, t0, admit_s)

    def _schedule(self, new: list[Call], t0: float) -> tuple[list[Call], StepPlan, float]:
        """Admit what arrived (and what was held), then the policy's order of the step:
        (the calls it advances, the order, seconds admission took)."""
        self.admission.admit(self.admission.held + new, t0)
        admit_s = time.perf_counter() - t0
        chosen, order = plan_step(self.admission.running, self.policy, self.step_tokens)
        return chosen, order, admit_s

    def _run(self, chosen: list[Call], order: StepPlan) -> StepOutput:
        """The step's forward and draw (`Executor.step`); if a forward ran (`ran`), its
        cost taught to the policy (a step whose forward failed teaches nothing)."""
        t_step = time.perf_counter()
        out = self.executor.step(order)
        out.ran = bool(chosen) and out.ran
        if out.ran:
            seconds = time.perf_counter() - t_step
            self.policy.observe(out.calls, out.rows, seconds, out.chunks, out.keys)
            if self.policy.charges:
                self.policy.served(service(chosen, out), time.perf_counter())
            self.n.steps += 1
            self.n.calls_in_steps += len(chosen)
        return out

    def _postprocess(self, out: StepOutput) -> None:
        """The step's errors and handles on its calls (its tokens go to their callers on
        the loop, `_account`); the calls done leave the running set for `finished`."""
        for call, exc in out.failed:
            call.error = exc
        for call, handle in out.finished.items():
            call.handle = handle
            self._stamp(call)
        for call in [c for c in self.admission.running if c.done]:
            self.admission.leave(call)
            self.admission.finished.append(call)

    def _recorded(self, out: StepOutput, t0: float, admit_s: float) -> StepOutput:
        """The step's record: it began at t0 and ends now, with what was running and
        queued and the executor's gauges at its end (torch thread)."""
        out.t0, out.end, out.admit_s = t0, time.perf_counter(), admit_s
        out.running = len(self.admission.running) + len(self.admission.finished)
        out.queue = self.queue_depth() + len(self.admission.held)
        out.gauges = self.executor.gauges()
        return out

    def _stamp(self, call: Call) -> None:
        """Note on the new message when its workflow started (the policy's victim order)."""
        if (msg := self.executor.table.find(call.handle.id)) is not None:
            msg.started = started(call)

    def _shut_down(self) -> None:
        """Fail every call still queued or running; nothing is left waiting."""
        self._closing = self._stopped = True
        self._stepped.set()
        error = self._closed_error()
        error.__cause__ = self._dead
        leftover = [
            c
            for c in self._incoming
            if c not in self.admission.running and c not in self.admission.held
        ]
        leftover += self.admission.running + self.admission.held
        leftover += [c for c in self.admission.finished if not c.ended.is_set()]
        self.admission.clear()
        self._incoming = []
        while True:
            try:
                leftover.append(self._recv.receive_nowait())
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                break
        self._recv.close()
        for call in leftover:
            if call.plan is not None and call.handle is None:
                self.executor.abort(call)
            if call.error is None and call.handle is None:
                call.error = error
            self.end(call)

    def figures(self) -> dict[str, float]:
        queue = self.queue_depth() + len(self.admission.held)
        return self.n.figures(queue, len(self.admission.running))
