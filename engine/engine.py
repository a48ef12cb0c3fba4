"""The public async Engine: prefill / decode with parents and offsets over one global cache."""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
from collections.abc import AsyncIterator, Awaitable, Generator, Iterable, Mapping
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import torch
from rich.console import Console

from corps.cache.handle import Handle, bind
from corps.cache.kv import KVStore
from corps.cache.visibility import Leak, LeakWarning
from corps.engine.access import Guard, TraceEvent, check_access
from corps.engine.core import CONTEXTS, Core
from corps.engine.errors import EngineBusy, InvalidRequest
from corps.engine.registry import DEFAULT_MODEL, resolve_model
from corps.engine.requests import PrefillRequest, decode_request, prefill_request
from corps.engine.scheduler import Job, Scheduler
from corps.engine.stats import EngineStats
from corps.engine.trace import Freed, Header, Recorder, TraceFile, version
from corps.engine.tracing import end_events, queued_event
from corps.engine.weights import load_weights, read_spec

#: dtype name -> the dtype of weights, activations and the KV store. "mixed" is float32
#: except the projections' weights: float16 for one row, bfloat16 for more
#: (`corps.engine.linear`).
DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "mixed": torch.float32,
}
#: The default dtype: 2-3x float32's decode speed, within 16-bit rounding of it
#: (README, "Precision"); float32 is the exact one.
DEFAULT_DTYPE = "mixed"
#: Default KV memory (the store and the view arena together) when no capacity is given.
DEFAULT_MEMORY_BUDGET = 2 << 30
#: The default budget never buys more slots than this: a tiny model would otherwise
#: get millions of slots (and their bookkeeping) it has no use for.
DEFAULT_MAX_CAPACITY = 1 << 17


__all__ = ["Engine", "LeakWarning", "Pending", "TextStream", "TraceEvent"]


class Engine:
    """One model, one global KV store and one batching loop, shared by every caller.

    Open it with `async with Engine.open(...) as engine:` (or `async with engine:`
    after `Engine.load`). Every call from any task is queued to the engine's
    scheduler, which fuses all concurrent calls into shared forward steps run on
    a worker thread, so the event loop stays free while the model computes.
    """

    def __init__(
        self,
        core: Core,
        *,
        queue_size: int = 256,
        step_tokens: int = 512,
        leak_policy: str = "warn",
        trace: str | Path | None = None,
        model_name: str | None = None,
        auto_free: bool = False,
        max_running: int = 256,
    ) -> None:
        self._core = core
        self.auto_free = auto_free
        self._deferred: list[int] = []  # unreferenced ids still pinned by a running call
        self.recorder = Recorder()
        """Trace events go to its sinks (`recorder.add(fn)`); see `corps.engine.trace`."""
        self._sched = Scheduler(
            core,
            queue_size=queue_size,
            step_tokens=step_tokens,
            recorder=self.recorder,
            max_running=max_running,
        )
        self._tg: anyio.abc.TaskGroup | None = None
        self._guard = Guard(core.table, mode=core.mode, policy=leak_policy, recorder=self.recorder)
        self._ids = itertools.count(1)
        self._model_name = model_name or core.model_path.name
        self._trace_file = self.trace_to(trace) if trace is not None else None
        self._sched.after_step = self._sweep

    # ---- construction and lifetime ----

    @classmethod
    def load(
        cls,
        model: str = DEFAULT_MODEL,
        *,
        mode: str = "choreographed",
        device: str = "cpu",
        dtype: str = DEFAULT_DTYPE,
        capacity: int | None = None,
        memory_budget: int | None = None,
        queue_size: int = 256,
        step_tokens: int = 512,
        leak_policy: str = "warn",
        trace: str | Path | None = None,
        auto_free: bool = False,
        max_running: int = 256,
        contexts: str | None = None,
        console: Console | None = None,
    ) -> Engine:
        """Load synchronously (blocks); start it with `async with engine:`.

        The KV store holds `capacity` tokens, and the view arena (calls' rotated
        contexts, each shared context once) as many. Without `capacity`, the two
        together take at most `memory_budget` bytes (default 2 GiB, capped at
        DEFAULT_MAX_CAPACITY store slots); `stats().kv_bytes` says what was taken.
        The memory is given back when the engine closes.

        `dtype`: "mixed" (default: float32 activations, attention and KV store, with
        16-bit projection weights, float16 for one row and bfloat16 for more;
        2-3x float32's decode speed, within 16-bit rounding of it; see
        `corps.engine.linear`), "float32" (exact against transformers; a batched call
        equals itself alone up to float32 rounding), "bfloat16" or "float16". The
        attention backend follows the device, or `CORPS_ATTENTION`
        (`corps.engine.attention`).

        `contexts`: how calls hold the contexts they read. "copy" (default, fastest):
        each placed context is rotated once into the view arena and shared by every
        concurrent call that reads it, so KV memory is the store plus one copy of
        each live context. "store": nothing is copied; attention reads each context
        from the store, rotating its keys one layer at a time at every step, so KV
        memory is the store plus calls' own tokens (and a one-layer scratch), and
        steps over long contexts are slower (`corps bench memory` measures both).
        "store" needs the torch attention backend. None: `CORPS_CONTEXTS`, else "copy".

        `trace=PATH` writes every call, message, actor event and leak to PATH as
        JSON lines (`corps trace view PATH`); off by default. `auto_free=True`
        frees a message's encoding once the last `Handle` naming it is garbage
        collected (off by default: then only `free` releases encodings).

        Admission: a call runs once its memory can be had (its prompt and every
        token it may generate are reserved up front, so it never runs out
        mid-generation); until then it waits, first come first served, while
        running calls may give memory back. At most `max_running` calls run at
        once. A call that could never fit raises `StoreTooSmall` at once.
        """
        contexts = contexts or os.environ.get("CORPS_CONTEXTS", "").strip().lower() or "copy"
        if contexts not in CONTEXTS:
            raise InvalidRequest(f"contexts must be one of {', '.join(CONTEXTS)}, got {contexts!r}")
        if dtype not in DTYPES:
            raise InvalidRequest(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise InvalidRequest(f"device {device!r} asked for, but torch sees no CUDA device")
        path = resolve_model(model, console=console)
        spec = read_spec(path)
        torch_dtype = DTYPES[dtype]
        if capacity is None:
            per_token = KVStore.bytes_per_token(
                spec.num_layers, spec.num_kv_heads, spec.head_dim, torch_dtype
            )
            # the budget buys the store and a view arena of the same size (and with
            # contexts="store" a one-layer scratch as long): every token slot costs
            # twice and a bit (`stats().kv_bytes` is what it bought, never more)
            per_slot = 2 * per_token + (per_token // spec.num_layers if contexts == "store" else 0)
            if memory_budget is None:  # default: 2 GiB, at most DEFAULT_MAX_CAPACITY slots
                capacity = max(1024, min(DEFAULT_MAX_CAPACITY, DEFAULT_MEMORY_BUDGET // per_slot))
            else:
                capacity = memory_budget // per_slot
                if capacity < 256:
                    raise InvalidRequest(
                        f"memory_budget={memory_budget} bytes buys {capacity} token slots "
                        f"(store and views, {per_slot} bytes per slot); give at least "
                        f"{256 * per_slot}"
                    )
        from transformers import AutoTokenizer

        weights = load_weights(path, dtype=torch_dtype, device=device, mixed=dtype == "mixed")
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        if mode == "hf":  # reference: transformers generate, one call at a time
            from transformers import AutoModelForCausalLM

            from corps.engine.hf import HFCore

            hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype).to(device)
            core = HFCore(
                hf, weights, tokenizer, model_path=path, capacity=capacity, precision=dtype
            )
        else:
            core = Core(
                weights,
                tokenizer,
                model_path=path,
                mode=mode,
                capacity=capacity,
                precision=dtype,
                contexts=contexts,
            )
        return cls(
            core,
            queue_size=queue_size,
            step_tokens=step_tokens,
            leak_policy=leak_policy,
            trace=trace,
            model_name=model,
            auto_free=auto_free,
            max_running=max_running,
        )

    @classmethod
    @asynccontextmanager
    async def open(cls, model: str = DEFAULT_MODEL, **kwargs: Any) -> AsyncIterator[Engine]:
        """`async with Engine.open("smollm2-135m", mode="choreographed") as engine:`."""
        engine = await anyio.to_thread.run_sync(partial(cls.load, model, **kwargs))
        async with engine:
            yield engine

    async def __aenter__(self) -> Engine:
        if self._tg is not None or self._sched.started:
            raise InvalidRequest("this engine was already started; an engine runs once")
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._sched.started = True
        self._tg.start_soon(self._sched.run)
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        """Shut down: calls still queued or running fail with EngineClosed; never hangs."""
        await self._sched.close()
        # The loop task ends on close(); the body's own exception (if any) propagates
        # as itself rather than wrapped in an ExceptionGroup.
        await self._tg.__aexit__(None, None, None)
        if self._trace_file is not None:
            self.end_trace(self._trace_file)
        # The KV memory goes back now, not when the last Handle naming this engine is
        # collected.
        self._core.drop_memory()
        return None

    # ---- tracing ----

    def trace_to(self, path: str | Path) -> TraceFile:
        """Start writing trace events to `path` (JSON lines, a header first); returns the
        sink to pass to `end_trace`. `Engine.open(trace=PATH)` does this for the engine's
        whole life."""
        core = self._core
        header = Header(
            corps=version(),
            model=self._model_name,
            mode=core.mode,
            dtype=core.precision,
            device=str(core.device),
            started_unix=self.recorder.started_unix,
        )
        sink = TraceFile(path, header)
        self.recorder.add(sink)
        return sink

    def end_trace(self, sink: TraceFile) -> None:
        """Stop writing to `sink` and close its file (with its closing line)."""
        self.recorder.remove(sink)
        sink.close(self.recorder.now())

    # ---- introspection ----

    @property
    def tokenizer(self):
        """The model's Hugging Face tokenizer."""
        return self._core.tokenizer

    @property
    def model_path(self) -> Path:
        """Local HF-format directory the weights were loaded from."""
        return self._core.model_path

    @property
    def mode(self) -> str:
        return self._core.mode

    @property
    def leak_policy(self) -> str:
        """The default leak policy of calls made as an agent (see `corps.engine.access`)."""
        return self._guard.policy

    def stats(self) -> EngineStats:
        """A snapshot; safe to call while steps run."""
        guard, table = self._guard, self._core.table
        self._sweep()
        return dataclasses.replace(
            self._core.stats(),
            **self._sched.figures(),
            leaks=guard.leak_count,
            reencodes=guard.reencode_count,
            records=table.records,
        )

    def reset_peak_stats(self) -> None:
        """Start `stats()`'s peaks (`view_tokens_peak`, `scratch_tokens_peak`) over from
        what is held now, to measure one phase of a workflow."""
        self._core.reset_peaks()

    def leaks(self) -> list[Leak]:
        """The latest leaks recorded (policies allow and warn), oldest first: at most
        `corps.engine.access.RECENT`; `stats().leaks` counts them all, each message
        carries its own call's count (`Handle.leaks`), and a trace file keeps each one."""
        return list(self._guard.leaks)

    def trace(self) -> list[TraceEvent]:
        """The latest leak and re-encoding events (bounded as `leaks()`)."""
        return list(self._guard.events)

    def read(self, handle: Handle, *, reader: str | None) -> str:
        """The text of a message, if `reader` may see it (else AccessDenied)."""
        check_access(self._core.table, reader, [handle])
        return self._core.table.get(handle.id).text

    def free(self, handle: Handle) -> None:
        """Release a message's encoding (and its re-encoded copies); a call still
        reading it, or queued to read it, keeps it until that call ends. Its text
        stays readable through its handles; its record goes once none is left."""
        self._free_id(handle.id, handle)
        self._sweep()

    def _free_id(self, mid: int, handle: Handle | None = None) -> None:
        self._core.free(handle or Handle(mid, self._core.table))
        if self.recorder.on:
            self.recorder.emit(Freed(t=self.recorder.now(), id=mid))
        for copy in self._guard.forget(mid):
            if not copy.freed:
                self._free_id(copy.id, copy)

    def _sweep(self) -> None:
        """Handle objects that died since the last sweep: free their messages (with
        `auto_free`), and forget freed records nothing refers to. Event loop only."""
        table = self._core.table
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

    # ---- calls ----

    async def prefill(self, message: str | list[int], **kwargs: Any) -> Handle:
        """Encode `message` attending to `parents` placed at `offsets`; returns its handle.

        Keywords: role="user", parents=(), offsets=None, new_offset=None, frame=True,
        owner=None, visibility=None, leak_policy=None. A call made as an `owner` returns
        a handle bound to that owner (see `Handle`).
        """
        policy = kwargs.pop("leak_policy", None)
        return await self._run(await self._job(prefill_request(message, **kwargs), policy))

    async def decode(self, **kwargs: Any) -> Handle:
        """Generate a message that starts with the role marker + `header`.

        Keywords: parents=(), offsets=None, new_offset=None, role="assistant",
        header="", frame=True, max_tokens=256, temperature=0.0, top_p=1.0, top_k=0,
        seed=None, stop=(), ignore_eos=False, force=(), owner=None, visibility=None,
        leak_policy=None.
        """
        policy = kwargs.pop("leak_policy", None)
        return await self._run(await self._job(decode_request(**kwargs), policy))

    async def prefill_many(self, requests: Iterable[Mapping[str, Any]]) -> list[Handle]:
        """Prefill messages that do not attend to each other; handles in order.

        All or nothing: if one call fails, the others are cancelled, any that had
        finished are freed, and that call's error is raised.
        """
        return await self._run_all([(prefill_request(**r), p) for r, p in _split_policy(requests)])

    async def decode_many(self, requests: Iterable[Mapping[str, Any]]) -> list[Handle]:
        """Decode several messages in parallel (fused into shared steps); handles in order.

        All or nothing, as `prefill_many`.
        """
        return await self._run_all([(decode_request(**r), p) for r, p in _split_policy(requests)])

    def prefill_nowait(self, message: str | list[int], **kwargs: Any) -> Pending:
        """Queue a prefill without waiting for queue space (EngineBusy if full).

        Access and the leak policy are checked now, as for `prefill`. Under
        leak_policy="reencode", a call that first needs new clean copies of its
        parents is queued when the returned `Pending` is awaited.
        """
        policy = kwargs.pop("leak_policy", None)
        return self._submit_nowait(prefill_request(message, **kwargs), policy)

    def decode_nowait(self, **kwargs: Any) -> Pending:
        """Queue a decode without waiting for queue space (EngineBusy if full); as above."""
        policy = kwargs.pop("leak_policy", None)
        return self._submit_nowait(decode_request(**kwargs), policy)

    def stream(self, **kwargs: Any) -> TextStream:
        """`async for delta in engine.stream(...)`: text deltas; then `.handle`."""
        policy = kwargs.pop("leak_policy", None)
        return TextStream(self, decode_request(**kwargs), policy)

    # ---- submission: every path goes through the guard and pins its parents ----

    async def _job(self, request, policy: str | None, cid: int | None = None) -> Job:
        """Check access and the leak policy, re-encode if needed, pin parents: a Job."""
        cid = cid or next(self._ids)
        request, missing, leaks = self._guard.check(request, policy, call_id=cid)
        if missing:
            request = await self._guard.reencode(request, self._prefill_internal)
        job = self._pinned_job(request, cid)
        job.leaks = leaks
        return job

    def _pinned_job(self, request, cid: int) -> Job:
        """A job whose parents are pinned from now until it ends: a `free` in between
        waits for it instead of failing it. `cid` is its call id in traces."""
        pins = self._core.pin(request.parents)
        job = Job(request, id=cid)
        job.on_end, job.orphan = partial(self._job_ended, pins), self._core.free
        if self.recorder.on:
            self.recorder.emit(queued_event(self.recorder, job))
        return job

    def _job_ended(self, pins: list, job: Job) -> None:
        self._core.unpin(pins)
        if job.handle is not None and (job.error is not None or job.cancelled):
            self._core.free(job.handle)  # finished, but nobody will ever receive it
            job.handle = None
        if job.handle is not None and job.leaks:
            self._core.table.get(job.handle.id).extra["leaks"] = job.leaks
        if self.recorder.on:
            for event in end_events(self.recorder, self._core.table, job):
                self.recorder.emit(event)

    async def _prefill_internal(self, request: PrefillRequest) -> Handle:
        return await self._run(self._pinned_job(request, next(self._ids)))

    async def _run(self, job: Job) -> Handle:
        try:
            await self._sched.submit(job)
        except BaseException:
            job.end()  # never queued: give its pins back
            raise
        return bind(await job.wait(), job.request.owner)

    async def _run_all(self, requests: list[tuple[Any, str | None]]) -> list[Handle]:
        jobs: list[Job] = []
        queued = 0
        try:
            for request, policy in requests:
                jobs.append(await self._job(request, policy))
            for job in jobs:  # no yield between them while there is room: one step
                try:
                    self._sched.submit_nowait(job)
                except EngineBusy:
                    await self._sched.submit(job)
                queued += 1
            return [bind(await job.wait(), job.request.owner) for job in jobs]
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._undo(jobs, queued)
            raise

    async def _undo(self, jobs: list[Job], queued: int) -> None:
        """Cancel every job of a failed *_many call and free what they made."""
        for job in jobs:
            job.cancelled = True
        for job in jobs[queued:]:
            job.end()
        for job in jobs[:queued]:
            await job.done.wait()  # the loop aborts cancelled jobs at its next step
        for job in jobs:
            if job.handle is not None:
                self._core.free(job.handle)
                job.handle = None

    def _submit_nowait(self, request, policy: str | None) -> Pending:
        cid = next(self._ids)
        request, missing, leaks = self._guard.check(request, policy, call_id=cid)
        if missing:  # re-encodings must run first: queue the call when awaited
            return Pending(self._job(request, policy, cid), self)
        job = self._pinned_job(request, cid)
        job.leaks = leaks
        try:
            self._sched.submit_nowait(job)
        except BaseException:
            job.end()
            raise
        return Pending(job, self)


def _split_policy(requests: Iterable[Mapping[str, Any]]):
    for r in requests:
        r = dict(r)
        policy = r.pop("leak_policy", None)
        yield r, policy


class Pending:
    """A queued call: `await pending` for its handle; cancelling the await cancels it."""

    def __init__(self, job: Job | Awaitable[Job], engine: Engine) -> None:
        self._job = job
        self._engine = engine
        self._cancelled = False

    def __await__(self) -> Generator[Any, None, Handle]:
        return self._wait().__await__()

    async def _wait(self) -> Handle:
        job = self._job
        if not isinstance(job, Job):  # deferred: re-encode, then queue
            job = self._job = await job
            job.cancelled = self._cancelled
            return await self._engine._run(job)
        return bind(await job.wait(), job.request.owner)

    def cancel(self) -> None:
        self._cancelled = True
        if isinstance(self._job, Job):
            self._job.cancelled = True


class TextStream:
    """Text deltas of one decode call as they are generated; `.handle` once done.

    The deltas (the header first, then generated text) concatenate to the final
    `handle.text`; while streaming they are always a prefix of it: text that
    could still turn out to be (the start of) a stop string is held back until it
    cannot, and a partial character until it is complete. Detokenising is
    incremental (a short window of recent ids per token).

    Leaving early cancels the call (its partial tokens are rolled back, or its
    finished message freed). Use `async with engine.stream(...) as s: async for d
    in s:` (or `await s.aclose()`) for that to happen at once; a bare `async for`
    that breaks leaves the closing to the garbage collector.
    """

    def __init__(self, engine: Engine, request, policy: str | None = None) -> None:
        self._engine = engine
        self._request = request
        self._policy = policy
        self._gen: Any = None
        self.handle: Handle | None = None

    def __aiter__(self) -> AsyncIterator[str]:
        if self._gen is not None:
            raise InvalidRequest("a stream can be iterated once; call engine.stream again")
        self._gen = self._deltas()
        return self._gen

    async def aclose(self) -> None:
        """Cancel the call if it is still running (free its message if it finished)."""
        if self._gen is not None:
            await self._gen.aclose()

    async def __aenter__(self) -> TextStream:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

    async def _deltas(self) -> AsyncIterator[str]:
        req = self._request
        fmt = self._engine._core.fmt
        header = fmt.encode(req.header) if isinstance(req.header, str) else list(req.header)
        detok = _Detokenizer(fmt, req.sampling.stop, header)
        send, recv = anyio.create_memory_object_stream[str](max_buffer_size=math.inf)

        def on_token(tok: int) -> None:  # runs on the event loop, between steps
            delta = detok.push(tok)
            if delta:
                send.send_nowait(delta)

        job = await self._engine._job(self._request, self._policy)
        job.on_token, job.on_done = on_token, send.close
        queued = False
        try:
            async with recv:
                await self._engine._sched.submit(job)
                queued = True
                async for delta in recv:
                    yield delta
            self.handle = bind(await job.wait(), self._request.owner)
        except BaseException:
            job.cancelled = True
            if not queued:
                job.end()  # never queued: give its pins back
            elif job.done.is_set() and job.handle is not None:
                self._engine._core.free(job.handle)  # finished, but the consumer left
                job.handle = None
            raise
        final = self._engine._core.table.get(self.handle.id).text
        if final.startswith(detok.shown) and len(final) > len(detok.shown):
            yield final[len(detok.shown) :]  # what was held back


class _Detokenizer:
    """Turns sampled ids into safe text deltas, incrementally.

    Each token decodes only a few ids: the new ones plus `CONTEXT` earlier ids
    (so tokenizers that render a token differently at the start of a text, like
    SentencePiece's leading space, still join correctly), and keeps the difference.
    """

    CONTEXT = 4

    def __init__(self, fmt, stop: tuple[str, ...], header: list[int]) -> None:
        self.fmt = fmt
        self.stop = stop
        self.hold = max((len(x) for x in stop), default=1) - 1
        self.ids = [t for t in header if t not in fmt.stop_ids]  # the handle's text starts here
        self.read = len(self.ids)  # ids[:read] are reflected in `text`
        self.text = fmt.decode(self.ids)
        self.shown = ""  # what was yielded: always a prefix of `text`
        self.stopped = False

    def push(self, tok: int) -> str:
        if tok in self.fmt.stop_ids or self.stopped:
            return ""
        self.ids.append(tok)
        ctx = max(0, self.read - self.CONTEXT)
        before = self.fmt.decode(self.ids[ctx : self.read])
        full = self.fmt.decode(self.ids[ctx:])
        if full.endswith("\ufffd") or not full.startswith(before):
            return ""  # a partial character: wait for the rest of its bytes
        self.text += full[len(before) :]
        self.read = len(self.ids)
        if any(x in self.text for x in self.stop):
            self.stopped = True  # the handle cuts here; the final flush yields the rest
            return ""
        safe = len(self.text) - self.hold
        if safe <= len(self.shown):
            return ""
        delta, self.shown = self.text[len(self.shown) : safe], self.text[:safe]
        return delta
