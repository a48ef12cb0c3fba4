"""The public async Engine: prefill / decode with parents and offsets over one global cache."""

from __future__ import annotations

import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, Unpack

import anyio
from rich.console import Console

from corps.cache.durable import DurableStore
from corps.cache.handle import Handle
from corps.cache.messages import MessageRecord
from corps.cache.visibility import Leak, Visibility
from corps.engine.api.access import AccessEvent, check_access
from corps.engine.api.build import build_executor
from corps.engine.api.parts import wire
from corps.engine.api.pending import Pending
from corps.engine.api.select import By, Selection, select
from corps.engine.api.stream import TextStream
from corps.engine.api.tracing import live_spans, trace_header
from corps.engine.api.turns import RecordedRun, recorded
from corps.engine.audit import AuditReport
from corps.engine.config import EngineConfig
from corps.engine.distill.graph import MessageGraph, message_graph
from corps.engine.errors import InvalidRequest
from corps.engine.exec.executor import Executor
from corps.engine.exec.torch_thread import TORCH
from corps.engine.repair import Repair
from corps.engine.request.chat_format import ChatFormat
from corps.engine.request.requests import (
    DecodeArgs,
    DecodeRequest,
    PrefillArgs,
    PrefillRequest,
    Text,
    prefill_request,
    prefill_request_of,
)
from corps.engine.request.workflow import CURRENT, Objective, workflow
from corps.engine.sched.gate import WorkflowGate
from corps.engine.sched.policies import Policy
from corps.engine.stats import EngineStats
from corps.engine.trace.events import Recorder, TraceFile
from corps.engine.trace.exporter import LiveSpans, check_available

Request = PrefillRequest | DecodeRequest

__all__ = ["Engine"]


class Engine:
    """One model, one global KV store and one batching loop, shared by every caller.

    Open it with `async with Engine.open(...) as engine:` (or `async with engine:`
    after `Engine.load`). Every call from any task is queued to the engine's
    scheduler, which fuses all concurrent calls into shared forward steps run on
    the process's torch thread (`corps.engine.exec.torch_thread`; the engine is built
    there too), so the event loop stays free while the model computes.
    """

    def __init__(self, executor: Executor, config: EngineConfig | None = None) -> None:
        cfg = config or EngineConfig.of(str(executor.model_path), mode=executor.mode)
        self._config = cfg
        self._executor = executor
        self.recorder = Recorder()
        """Trace events go to its sinks (`recorder.add(fn)`); see `corps.engine.trace.events`."""
        self._tg: anyio.abc.TaskGroup | None = None
        self._parts = parts = wire(executor, cfg, self.recorder, self._spawn)
        self._sched, self._guard, self._submit = parts.sched, parts.guard, parts.submit
        self._auditor, self._lifetimes = parts.auditor, parts.lifetimes
        self.gate: WorkflowGate | None = parts.gate
        """Workflow-level admission (`corps.engine.sched.gate`): a pattern's run enters
        it before its first call; None when off (`admission=False`, or no store in
        mode "hf") and no `max_workflows` is set."""
        self._model_name = cfg.model
        self._trace_file = self.trace_to(cfg.trace) if cfg.trace is not None else None
        self.otel: LiveSpans | None = (
            None if cfg.otel is None else live_spans(cfg, executor, self.recorder)
        )
        """With `otel=URL`: the live span sender (`sent`, `dropped`); else None."""

    # ---- construction and lifetime ----

    @classmethod
    def load(
        cls,
        config: EngineConfig | str | None = None,
        /,
        *,
        console: Console | None = None,
        **fields: Any,
    ) -> Engine:
        """Load synchronously (blocks); start it with `async with engine:`.

        `config` is an `EngineConfig`, a model name, or None (the default model);
        `fields` override its settings (`EngineConfig` lists them with what they
        mean). Everything is validated before any weights load: a bad value raises
        InvalidRequest at once.

        Memory (`capacity`, `memory_budget`: `stats().kv_bytes` says what was taken) is
        given back when the engine closes. A call runs once its memory can be had (its
        prompt and every token it may generate reserved up front); until then it
        waits while running calls may give memory back; one that could never fit
        raises `StoreTooSmall` at once (`EngineConfig`: `capacity`, `max_running`).
        """
        cfg = EngineConfig.of(config, **fields)
        if cfg.otel is not None:
            check_available(cfg.otel_protocol)  # before any weights load
        # built on the torch thread, where it will step: see corps.engine.exec.torch_thread
        return cls(TORCH.call(build_executor, cfg, console), cfg)

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        config: EngineConfig | str | None = None,
        /,
        *,
        console: Console | None = None,
        **fields: Any,
    ) -> AsyncIterator[Engine]:
        """`async with Engine.open("smollm2-135m", mode="choreographed") as engine:`, or
        `Engine.open(config)` with an `EngineConfig` (fields override it)."""
        cfg = EngineConfig.of(config, **fields)  # bad settings fail here, on the caller
        engine = await TORCH.run(partial(cls.load, cfg, console=console))
        async with engine:
            yield engine

    @property
    def config(self) -> EngineConfig:
        """The settings this engine was built from (frozen; pickles)."""
        return self._config

    async def __aenter__(self) -> Engine:
        if self._tg is not None or self._sched.started:
            raise InvalidRequest("this engine was already started; an engine runs once")
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._sched.started = True
        self._tg.start_soon(self._sched.run)
        self._tg.start_soon(self._sweep_after_steps)
        return self

    def _spawn(self, task: Callable[[], Awaitable[Any]]) -> bool:
        """Start `task` in the engine's task group; False when the engine is not running."""
        if self._tg is None or not self._sched.accepting:
            return False
        self._tg.start_soon(task)
        return True

    async def _sweep_after_steps(self) -> None:
        """After every step, free what dead handles named (`Lifetimes.sweep`)."""
        while await self._sched.stepped():
            self._lifetimes.sweep()

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        """Shut down: calls still queued or running fail with EngineClosed; never hangs."""
        await self._sched.close()
        # the loop ends on close(); the body's own exception propagates as itself
        await self._tg.__aexit__(None, None, None)
        if self._trace_file is not None:
            self.end_trace(self._trace_file)
        if self.otel is not None:
            self.recorder.remove(self.otel)
            self.otel.close(self.recorder.now())
        self._executor.close()  # the KV memory goes back now, not when its last handle goes
        return None

    # ---- tracing ----

    def trace_to(self, path: str | Path) -> TraceFile:
        """Start writing trace events to `path` (JSON lines, a header first); returns the
        sink to pass to `end_trace`. `Engine.open(trace=PATH)` does this for the engine's
        whole life."""
        policy, started = self._sched.policy.name, self.recorder.started_unix
        sink = TraceFile(path, trace_header(self._executor, self._model_name, policy, started))
        self.recorder.add(sink)
        return sink

    def end_trace(self, sink: TraceFile) -> None:
        """Stop writing to `sink` and close its file (with its closing line)."""
        self.recorder.remove(sink)
        sink.close(self.recorder.now())

    # ---- introspection ----

    @property
    def executor(self) -> Executor:
        """The step machine under this engine (`corps.engine.exec.executor.Executor`:
        the KV store's `KVExecutor`, or `HFExecutor` in mode "hf"), for tools and tests that
        measure or check it. Calls go through the engine, never through it."""
        return self._executor

    @property
    def tokenizer(self):
        """The model's Hugging Face tokenizer."""
        return self._executor.tokenizer

    @property
    def chat(self) -> ChatFormat:
        """The model's chat framing: `encode` / `decode` token ids, `frame(role)` (a
        role's header and footer text), `stop_ids` (end of turn) and `sink` (the
        attention sink's ids). For building raw prompts with `frame=False`."""
        return self._executor.fmt

    @property
    def model_path(self) -> Path:
        """Local HF-format directory the weights were loaded from."""
        return self._executor.model_path

    @property
    def mode(self) -> str:
        return self._executor.mode

    @property
    def context_length(self) -> int:
        """Logical positions a call may reach (the model's context length): a message's
        last token, and every token a decode may generate, sit below it."""
        return self._executor.max_positions

    @property
    def policy(self) -> Policy:
        """The batching loop's scheduling policy (`corps.engine.sched.policies`): its name,
        and for `objective` its bounds and what it has learnt of the step cost
        (`policy.cost`); set its fields before the first call to change them."""
        return self._sched.policy

    @property
    def leak_policy(self) -> str:
        """The default leak policy of calls made as an agent (see `corps.engine.api.access`)."""
        return self._guard.policy

    def graph(self, handles: Iterable[Handle], **meta: Any) -> MessageGraph:
        """The messages `handles` name and everything they attended to, as a
        `MessageGraph` (tokens and positions, no tensors) in the order they were made:
        what the differentiable recompute (`corps.engine.distill.differentiable`) redoes.
        Choreographed mode only (a baseline message attended to its parents' text, not
        to their encodings). `meta` is kept on the graph. Freed messages are fine."""
        if self.mode != "choreographed":
            raise InvalidRequest(
                f"a message graph is of choreographed encodings; this engine is {self.mode}"
            )
        return message_graph(self._executor.table, handles, self.chat.sink, meta)

    def stats(self) -> EngineStats:
        """A snapshot; safe to call while steps run."""
        return self._parts.stats(self._executor, self._config, self.otel)

    @property
    def store(self) -> DurableStore | None:
        """Where this engine's messages outlive it (`EngineConfig.store`), or None."""
        return self._executor.durable

    def handle(self, message_id: int, *, reader: str | None = None) -> Handle:
        """A handle to a live message of this engine by its id (`Handle.id`, e.g. sent
        over HTTP), bound to `reader` when given; UnknownHandle if the engine has no
        such message or it was freed."""
        table = self._executor.table
        table.live(message_id)
        return Handle(message_id, table, reader)

    def messages(self) -> list[MessageRecord]:
        """A read-only snapshot of every message record the engine holds (the attention
        sink, freed records still referenced and evicted encodings included)."""
        return [m.record() for m in self._executor.table.all()]

    def check(self) -> None:
        """Verify the engine's bookkeeping while no call is queued or running: every used
        KV slot has one owner (a message, or the baseline's prefix tree), the free list
        holds the rest once, no pins, view ranges or prefix locks are left. Raises
        BrokenInvariant (a bug in corps: report it); InvalidRequest while calls or audit
        shadows are in flight (`await engine.fidelity_report()` waits for those). O(slots)."""
        self._parts.check(self._executor)

    def reset_peak_stats(self) -> None:
        """Start `stats()`'s peaks (`view_tokens_peak`, `scratch_tokens_peak`) over from
        what is held now, to measure one phase of a workflow."""
        self._executor.reset_peaks()

    async def reset_prefix_cache(self) -> int:
        """Forget what earlier calls left cached for later ones, as if just opened: the
        baseline's cached prompt prefixes no running call reads (slots freed), and the
        record of them that bounds choreographed repairs; messages stay. For benchmarks
        that run inputs again (each as cold as the first); returns the tokens freed."""
        return await TORCH.run(self._executor.reset_prefix_cache)

    def leaks(self) -> list[Leak]:
        """The latest leaks recorded (policies allow and warn), oldest first: at most
        `corps.engine.api.access.RECENT`; `stats().leaks` counts them all, each message
        carries its own call's count (`Handle.leaks`), and a trace file keeps each one."""
        return list(self._guard.leaks)

    def access_events(self) -> list[AccessEvent]:
        """The access log: the latest leak and re-encoding events (bounded as `leaks()`).
        Not to be confused with trace files (`Engine.open(trace=PATH)`)."""
        return list(self._guard.events)

    def audit(self) -> list[AccessEvent]:  # deprecated ("audit" is the fidelity audit now)
        warnings.warn("Engine.audit() is Engine.access_events()", DeprecationWarning, 2)
        return self.access_events()

    async def audited(self, *, settle: bool = True) -> AuditReport:  # deprecated
        warnings.warn("Engine.audited() is Engine.fidelity_report()", DeprecationWarning, 2)
        return await self.fidelity_report(settle=settle)

    async def fidelity_report(self, *, settle: bool = True) -> AuditReport:
        """The online fidelity audit's figures (`corps.engine.audit`; `audit=N`), once
        every shadow started so far has run (`settle=False`: now): per workflow family,
        agent and repair policy, the calls audited, the mean gap (KL(baseline ||
        choreographed) nats per position) and argmax agreement, and the tokens the
        shadows encoded; and each key's policy under `repair="auto"`."""
        if settle:
            await self._auditor.settled()
        return self._auditor.report()

    def read(self, handle: Handle, *, reader: str | None) -> str:
        """The text of a message, if `reader` may see it (else AccessDenied)."""
        check_access(self._executor.table, reader, [handle])
        return self._executor.table.get(handle.id).text

    def held_by(self, owners: Iterable[str]) -> int:
        """Store slots held now by the live messages these agents own (what a
        workflow's agents keep beside the messages it holds handles to)."""
        return self._lifetimes.held_by(owners)

    def free_owned(self, owners: Iterable[str]) -> int:
        """Release every live message these agents own, as `free` releases one; how
        many. For the end of a workflow whose agents end with it: their messages go,
        including any it never got a handle to (a reply cut off by cancellation)."""
        return self._lifetimes.free_owned(owners)

    def free(self, handle: Handle) -> None:
        """Release a message's encoding (and its re-encoded copies); a call still
        reading it, or queued to read it, keeps it until that call ends. Its text
        stays readable through its handles; its record goes once none is left."""
        self._lifetimes.free(handle)

    def expect(self, *handles: Handle) -> None:
        """The current workflow's next step reads these messages (replacing what it
        expected; none: nothing now). Under memory pressure they are evicted last and,
        with a store, copied back from disk before it (`corps.engine.sched.next_reads`).
        InvalidRequest for what is not a handle, ForeignHandle / UnknownHandle as a call's."""
        ids = self._lifetimes.live_ids(handles)
        self._sched.admission.next_reads.expect(CURRENT.get(), ids)

    # ---- calls ----

    async def prefill(self, message: Text, **args: Unpack[PrefillArgs]) -> Handle:
        """Encode `message` attending to `parents` placed at `offsets`; returns its handle.

        Keywords (`PrefillArgs`): role="user", parents=(), offsets=None,
        new_offset=None, frame=True, owner=None, visibility=None, leak_policy=None.
        A call made as an `owner` returns a handle bound to that owner (see `Handle`).
        """
        return await self._submit.run(await self._submit.call(prefill_request(message, args)))

    async def decode(self, **args: Unpack[DecodeArgs]) -> Handle:
        """Generate a message that starts with the role marker + `header`.

        Keywords (`DecodeArgs`): parents=(), offsets=None, new_offset=None,
        role="assistant", header="", frame=True, owner=None, visibility=None,
        leak_policy=None, and sampling: `sampling=SamplingParams(...)` and/or its
        fields max_tokens=256, temperature=0.0, top_p=1.0, top_k=0, seed=None,
        stop=(), ignore_eos=False, force=().
        """
        return await self._submit.run(await self._submit.call(self._submit.decode_request(args)))

    async def prefill_many(
        self, requests: Iterable[PrefillRequest | Mapping[str, Any]]
    ) -> list[Handle]:
        """Prefill messages that do not attend to each other; handles in order. Each
        item is a `PrefillRequest` or a mapping of `message` and `PrefillArgs`.

        All or nothing: if one call fails, the others are cancelled, any that had
        finished are freed, and that call's error is raised.
        """
        return await self._submit.run_all([prefill_request_of(r) for r in requests])

    async def decode_many(
        self, requests: Iterable[DecodeRequest | Mapping[str, Any]]
    ) -> list[Handle]:
        """Decode several messages in parallel (fused into shared steps); handles in
        order. Each item is a `DecodeRequest` or a mapping of `DecodeArgs`. All or
        nothing, as `prefill_many`."""
        return await self._submit.run_all([self._submit.decode_request(r) for r in requests])

    def prefill_nowait(self, message: Text, **args: Unpack[PrefillArgs]) -> Pending:
        """Queue a prefill without waiting for queue space (EngineBusy if full).
        Access and the leak policy are checked now, as for `prefill`. Under
        leak_policy="reencode", a call that first needs new clean copies of its
        parents is queued when the returned `Pending` is awaited."""
        return self._submit.submit_nowait(prefill_request(message, args))

    def decode_nowait(self, **args: Unpack[DecodeArgs]) -> Pending:
        """Queue a decode without waiting for queue space (EngineBusy if full); as above."""
        return self._submit.submit_nowait(self._submit.decode_request(args))

    async def select(
        self, *, options: Sequence[str], parents: Sequence[Handle] = (),
        offsets: Sequence[int | None] | None = None, new_offset: int | None = None,
        role: str = "assistant", header: str = "", owner: str | None = None,
        visibility: Visibility | None = None, leak_policy: str | None = None,
        by: By = "normalized",
    ) -> Selection:  # fmt: skip
        """Score each of `options` as the reply after `parents` and keep the best.

        Every option is encoded as a `role` turn (`header`, then the option) attending
        to the same parents at the same offset, all in one fused step; its score is
        the log-probability of its tokens. The choice is the highest length-normalised
        score (`by="total"`: the highest sum); the chosen option's encoding is kept as
        a message (`Selection.handle`), the others are freed.
        """
        common = dict(role=role, parents=tuple(parents), offsets=offsets, new_offset=new_offset,
                      owner=owner, visibility=visibility, leak_policy=leak_policy)  # fmt: skip
        return await select(
            self._submit, self._executor.fmt, self.free, options, header, by, common
        )

    @staticmethod
    def workflow(
        name: str, objective: Objective = "throughput", repair: str | Repair | None = None,
        audit: int | None = None, family: str = "",
    ) -> AbstractContextManager:  # fmt: skip
        """`with engine.workflow("chat-42", objective="latency"):` tags every call made
        inside, agents' calls asked from inside included, with this workflow and
        objective, which the scheduling policy reads (`corps.engine.sched.policies`).
        `repair` (e.g. "recompute:0.15" or "auto", `corps.engine.repair`): the repair
        of its calls that name none and whose agent names none (None: the engine's).
        `audit` (N: 1 in N decodes, 0: off; None: the engine's): its calls' online
        fidelity audit (`corps.engine.audit`); `family`: the name audit figures and
        `repair="auto"` are kept under (workflows of one kind share it; "": `name`)."""
        return workflow(name, objective, repair, audit, family)

    def recorded(self, name: str) -> AbstractContextManager[RecordedRun]:
        """`with engine.recorded("run-7") as run:` records every call made inside in the
        store (`store=`), and replays those recorded before under that name: a killed run
        resumes; `await run.input(KEY)` pauses it for an outside input until it is given
        (`run.give`; `corps.engine.api.turns`). InvalidRequest without a store."""
        if self.store is None:
            raise InvalidRequest("recorded runs are kept in a store: open with store=DIR")
        return recorded(name, self._submit.turns, self.prefill)

    def stream(self, **args: Unpack[DecodeArgs]) -> TextStream:
        """`async for delta in engine.stream(...)`: text deltas; then `.handle`."""
        return self._submit.stream(self._submit.decode_request(args))
