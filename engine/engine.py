"""The public async Engine: prefill / decode with parents and offsets over one global cache."""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import AsyncIterator, Generator, Iterable, Mapping
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import torch
from rich.console import Console

from corps.cache.handle import Handle
from corps.cache.kv import KVStore
from corps.cache.visibility import Leak, LeakageError, can_read, check_policy
from corps.engine.access import check_access, explain, find_leaks, hidden_sources
from corps.engine.core import Core
from corps.engine.errors import InvalidRequest
from corps.engine.registry import DEFAULT_MODEL, resolve_model
from corps.engine.requests import PrefillRequest, decode_request, prefill_request
from corps.engine.scheduler import Job, Scheduler
from corps.engine.stats import EngineStats
from corps.engine.weights import load_weights, read_spec


class LeakWarning(UserWarning):
    """A call attended to another agent's hidden context (leak_policy="warn")."""


@dataclasses.dataclass(frozen=True)
class TraceEvent:
    kind: str  # "leak" or "reencode"
    detail: str
    leak: Leak | None = None


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: Default KV store budget when no capacity is given.
DEFAULT_MEMORY_BUDGET = 1 << 30


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
    ) -> None:
        self._core = core
        self._sched = Scheduler(core, queue_size=queue_size, step_tokens=step_tokens)
        self._tg: anyio.abc.TaskGroup | None = None
        self.leak_policy = check_policy(leak_policy)
        self._leaks: list[Leak] = []
        self._events: list[TraceEvent] = []
        self._clean: dict[tuple[int, str | None], Handle] = {}  # reencoded views, per reader

    # ---- construction and lifetime ----

    @classmethod
    def load(
        cls,
        model: str = DEFAULT_MODEL,
        *,
        mode: str = "choreographed",
        device: str = "cpu",
        dtype: str = "float32",
        capacity: int | None = None,
        memory_budget: int = DEFAULT_MEMORY_BUDGET,
        queue_size: int = 256,
        step_tokens: int = 512,
        leak_policy: str = "warn",
        console: Console | None = None,
    ) -> Engine:
        """Load synchronously (blocks); start it with `async with engine:`."""
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
            capacity = max(1024, memory_budget // per_token)
        from transformers import AutoTokenizer

        weights = load_weights(path, dtype=torch_dtype, device=device)
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        core = Core(weights, tokenizer, model_path=path, mode=mode, capacity=capacity)
        return cls(core, queue_size=queue_size, step_tokens=step_tokens, leak_policy=leak_policy)

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
        return None

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

    def stats(self) -> EngineStats:
        return dataclasses.replace(self._core.stats(), **self._sched.figures())

    def leaks(self) -> list[Leak]:
        """Every leak recorded so far (policies allow and warn), oldest first."""
        return list(self._leaks)

    def trace(self) -> list[TraceEvent]:
        return list(self._events)

    def read(self, handle: Handle, *, reader: str | None) -> str:
        """The text of a message, if `reader` may see it (else AccessDenied)."""
        check_access(self._core.table, reader, [handle])
        return handle.text

    def free(self, handle: Handle) -> None:
        """Release a message's encoding; a call still reading it keeps it until it ends."""
        self._core.free(handle)

    # ---- calls ----

    async def prefill(self, message: str | list[int], **kwargs: Any) -> Handle:
        """Encode `message` attending to `parents` placed at `offsets`; returns its handle.

        Keywords: role="user", parents=(), offsets=None, new_offset=None, frame=True,
        owner=None, visibility=None.
        """
        policy = kwargs.pop("leak_policy", None)
        return await self._submit(await self._guard(prefill_request(message, **kwargs), policy))

    async def decode(self, **kwargs: Any) -> Handle:
        """Generate a message that starts with the role marker + `header`.

        Keywords: parents=(), offsets=None, new_offset=None, role="assistant",
        header="", frame=True, max_tokens=256, temperature=0.0, top_p=1.0, top_k=0,
        seed=None, stop=(), ignore_eos=False, owner=None, visibility=None.
        """
        policy = kwargs.pop("leak_policy", None)
        return await self._submit(await self._guard(decode_request(**kwargs), policy))

    async def prefill_many(self, requests: Iterable[Mapping[str, Any]]) -> list[Handle]:
        """Prefill messages that do not attend to each other; handles in order."""
        return await self._submit_all(
            [await self._guard(prefill_request(**r), p) for r, p in _split_policy(requests)]
        )

    async def decode_many(self, requests: Iterable[Mapping[str, Any]]) -> list[Handle]:
        """Decode several messages in parallel; handles in order.

        If one fails, its error is raised; the others still complete.
        """
        return await self._submit_all(
            [await self._guard(decode_request(**r), p) for r, p in _split_policy(requests)]
        )

    def prefill_nowait(self, message: str | list[int], **kwargs: Any) -> Pending:
        """Queue a prefill without waiting for queue space (EngineBusy if full)."""
        return self._submit_nowait(Job(prefill_request(message, **kwargs)))

    def decode_nowait(self, **kwargs: Any) -> Pending:
        """Queue a decode without waiting for queue space (EngineBusy if full)."""
        return self._submit_nowait(Job(decode_request(**kwargs)))

    def stream(self, **kwargs: Any) -> TextStream:
        """`async for delta in engine.stream(...)`: text deltas; then `.handle`."""
        policy = kwargs.pop("leak_policy", None)
        return TextStream(self, decode_request(**kwargs), policy)

    async def _guard(self, request, policy: str | None) -> Job:
        """Access check and leak policy for a call, before anything is computed."""
        reader, parents = request.owner, list(request.parents)
        for p in parents:
            self._core._live(p)  # unknown, freed or foreign handles fail first
        check_access(self._core.table, reader, parents)
        if reader is None or self.mode == "baseline":  # baseline re-encodes: it cannot leak
            return Job(request)
        kind = "decode" if hasattr(request, "sampling") else "prefill"
        leaks = find_leaks(self._core.table, reader, parents, f"{kind} by {reader}")
        if not leaks:
            return Job(request)
        policy = check_policy(policy or self.leak_policy)
        if policy == "deny":
            raise LeakageError(explain(self._core.table, leaks[0]) + " (leak_policy='deny')")
        if policy == "reencode":
            clean = [await self._clean_view(p, reader) for p in parents]
            return Job(dataclasses.replace(request, parents=clean))
        for leak in leaks:
            text = explain(self._core.table, leak)
            self._leaks.append(leak)
            self._events.append(TraceEvent("leak", text, leak))
            if policy == "warn":
                warnings.warn(text, LeakWarning, stacklevel=3)
        return Job(request)

    async def _clean_view(self, parent: Handle, reader: str) -> Handle:
        """`parent` itself if its encoding hides nothing from `reader`; else a re-encoding
        of its tokens that attends only to what `reader` may see (cached per reader)."""
        table = self._core.table
        if not hidden_sources(table, reader, parent.id):
            return parent
        key = (parent.id, reader)
        cached = self._clean.get(key)
        if cached is not None and not cached.freed:
            return cached
        msg = table.get(parent.id)
        kept = [
            (Handle(q, table), off)
            for q, off in zip(msg.parents, msg.parent_offsets, strict=True)
            if can_read(reader, table.get(q).owner, table.get(q).visibility)
        ]
        parents = [await self._clean_view(q, reader) for q, _ in kept]
        request = PrefillRequest(
            list(msg.tokens), role=msg.role, parents=parents, offsets=[off for _, off in kept],
            new_offset=msg.offset, frame=False, owner=msg.owner, visibility=msg.visibility,
        )  # fmt: skip
        view = await self._submit(Job(request))
        copy = table.get(view.id)
        copy.text, copy.extra["view_of"], copy.extra["view_for"] = msg.text, msg.id, reader
        self._clean[key] = view
        self._events.append(
            TraceEvent("reencode", f"re-encoded message {msg.id} for {reader} as {view.id}")
        )
        return view

    async def _submit(self, job: Job) -> Handle:
        await self._sched.submit(job)
        return await job.wait()

    async def _submit_all(self, jobs: list[Job]) -> list[Handle]:
        try:
            for job in jobs:
                await self._sched.submit(job)
            return [await job.wait() for job in jobs]
        except BaseException:
            for job in jobs:
                job.cancelled = True
            raise

    def _submit_nowait(self, job: Job) -> Pending:
        self._sched.submit_nowait(job)
        return Pending(job)


def _split_policy(requests: Iterable[Mapping[str, Any]]):
    for r in requests:
        r = dict(r)
        policy = r.pop("leak_policy", None)
        yield r, policy


class Pending:
    """A queued call: `await pending` for its handle; cancelling the await cancels it."""

    def __init__(self, job: Job) -> None:
        self._job = job

    def __await__(self) -> Generator[Any, None, Handle]:
        return self._job.wait().__await__()

    def cancel(self) -> None:
        self._job.cancelled = True


class TextStream:
    """Text deltas of one decode call as they are generated; `.handle` once done.

    Breaking out of the loop early cancels the call.
    """

    def __init__(self, engine: Engine, request, policy: str | None = None) -> None:
        self._engine = engine
        self._request = request
        self._policy = policy
        self.handle: Handle | None = None

    async def __aiter__(self) -> AsyncIterator[str]:
        fmt = self._engine._core.fmt
        send, recv = anyio.create_memory_object_stream[str](max_buffer_size=math.inf)
        ids: list[int] = []
        shown = [""]

        def on_token(tok: int) -> None:  # runs on the event loop, between steps
            if tok in fmt.stop_ids:
                return
            ids.append(tok)
            text = fmt.decode(ids)
            if len(text) > len(shown[0]) and not text.endswith("\ufffd"):
                delta, shown[0] = text[len(shown[0]) :], text
                send.send_nowait(delta)

        job = await self._engine._guard(self._request, self._policy)
        job.on_token, job.on_done = on_token, send.close
        await self._engine._sched.submit(job)
        try:
            async with recv:
                async for delta in recv:
                    yield delta
            self.handle = await job.wait()
        except BaseException:
            job.cancelled = True
            raise
        final = self.handle.text  # flush what was held back (a partial character)
        if final.startswith(shown[0]) and len(final) > len(shown[0]):
            yield final[len(shown[0]) :]
