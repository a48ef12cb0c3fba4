"""The in-process actor runtime: spawn, send, ask, publish, supervise, shut down.

Each agent has a bounded mailbox and `max_concurrency` worker tasks (1 by
default: one message at a time, in arrival order). An `ask` runs the handler in
the agent's task inside a cancel scope owned by the envelope, so cancelling the
ask (or its timeout) cancels the handler, every nested ask it is awaiting, and
their engine calls.

Failures are never swallowed: a handler's exception goes back to the asker as
`AgentError`; for a fire-and-forget message it goes to supervision
(`restart` with a budget, `stop`, or `escalate` to the runtime, which then
fails). Messages that cannot be delivered go to `dead_letters` (the latest
`KEPT_DEAD_LETTERS`; `dead_letter_count` counts all) and the "dead-letters"
topic. Leaving `async with` cancels every worker and fails every queued
message with AgentStopped; no task is left running.
"""

from __future__ import annotations

import itertools
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from pydantic import BaseModel, ConfigDict

from corps.agents.agent import Agent
from corps.agents.ask_stream import AskStream
from corps.agents.envelope import Envelope, check_payload, current, describe, label
from corps.agents.errors import (
    AgentError,
    AgentStopped,
    AskTimeout,
    MailboxFull,
    UnknownAgent,
)
from corps.cache.errors import InvalidRequest
from corps.cache.handle import Handle, bind
from corps.cache.visibility import Private, Public
from corps.engine.request.workflow import CURRENT as workflow_var
from corps.engine.request.workflow import RUN as run_var
from corps.engine.trace.events import ActorEvent, ErrorEvent, Recorder

DEAD_LETTERS = "dead-letters"
#: Dead letters kept in `Runtime.dead_letters` (the latest); `dead_letter_count` counts all.
KEPT_DEAD_LETTERS = 1000
SUPERVISION = ("restart", "stop", "escalate")


class AgentRuntime(Protocol):
    """What agent code relies on; an out-of-process runtime implements the same.

    `Agent` uses exactly these members: `engine` (the engine its calls go to),
    `ask` (with `sender` and `deltas`, the stream of an enclosing `ask_stream`),
    `send`, `publish`.
    """

    engine: Any

    async def spawn(self, cls: type[Agent], name: str | None = None, **settings: Any) -> str: ...
    async def ask(
        self,
        to: str,
        msg: Handle | BaseModel,
        *,
        timeout: float | None = None,
        sender: str | None = None,
        deltas: MemoryObjectSendStream[str] | None = None,
    ) -> Any: ...
    async def send(
        self, to: str, msg: Handle | BaseModel, *, sender: str | None = None
    ) -> None: ...
    def send_nowait(
        self, to: str, msg: Handle | BaseModel, *, sender: str | None = None
    ) -> None: ...
    async def publish(
        self, topic: str, msg: Handle | BaseModel, *, sender: str | None = None
    ) -> None: ...
    def subscribe(self, topic: str, name: str) -> None: ...
    def ask_stream(
        self, to: str, msg: Handle | BaseModel, *, timeout: float | None = None
    ) -> AskStream: ...


#: The most workers one agent may run at once (each is a task).
MAX_CONCURRENCY = 1024


class DeadLetter(BaseModel):
    """A message that could not be delivered; also sent to the "dead-letters" topic."""

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)
    to: str
    message: Handle | BaseModel
    reason: str


@dataclass(eq=False)
class _Actor:
    name: str
    cls: type[Agent]
    instance: Agent
    send: MemoryObjectSendStream[Envelope]
    recv: MemoryObjectReceiveStream[Envelope]
    restarts: int = 0
    stopped: bool = False
    failures: list[AgentError] = field(default_factory=list)


class Runtime:
    """`async with Runtime(engine) as rt:` — the in-process runtime.

    The leak policy lives on the engine (`Engine.open(leak_policy=...)`); agent
    classes and single calls may override it.
    """

    def __init__(self, engine, *, trace: str | Path | None = None) -> None:
        """`trace=PATH` writes this runtime's actor events and its engine's calls to PATH
        while the runtime runs (as `Engine.open(trace=...)` does for an engine's life)."""
        self.engine = engine
        self._trace_path = trace
        self._trace_sink: Any = None
        self.dead_letters: deque[DeadLetter] = deque(maxlen=KEPT_DEAD_LETTERS)
        self.dead_letter_count = 0
        self._actors: dict[str, _Actor] = {}
        self._topics: dict[str, list[str]] = defaultdict(list)
        self._tg: anyio.abc.TaskGroup | None = None
        self._escalated: AgentError | None = None
        # Actor events go to the engine's trace (a stand-in engine may have none).
        self._rec: Recorder = getattr(engine, "recorder", None) or Recorder()
        self._asks = itertools.count(1)

    def _trace(self, event: str, agent: str, **kw: Any) -> None:
        if self._rec.on:
            self._rec.emit(ActorEvent(t=self._rec.now(), event=event, agent=agent, **kw))

    async def __aenter__(self) -> Runtime:
        if self._trace_path is not None:
            self._trace_sink = self.engine.trace_to(self._trace_path)
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        for actor in self._actors.values():
            self._stop(actor, "the runtime shut down")
        self._tg.cancel_scope.cancel()
        # The workers only ever end by this cancellation; the body's own exception
        # (if any) propagates as itself rather than wrapped in an ExceptionGroup.
        await self._tg.__aexit__(None, None, None)
        for actor in list(self._actors.values()):  # their encoded system prompts go too
            prompt = actor.instance.system_prompt
            if prompt is not None and not prompt.freed:
                self.engine.free(prompt)
        if self._trace_sink is not None:
            self.engine.end_trace(self._trace_sink)
            self._trace_sink = None
        cancelled = exc_info[0] is not None and issubclass(
            exc_info[0], anyio.get_cancelled_exc_class()
        )
        if self._escalated is not None and (exc_info[0] is None or cancelled):
            raise self._escalated  # the body was cancelled by the escalation itself
        return None

    # ---- agents ----

    async def spawn(self, cls: type[Agent], name: str | None = None, **settings: Any) -> str:
        """Start an agent; its system prompt is prefilled once, private to it.
        `settings` replace its class's (`system=`, `repair=`, or a setting of its
        own such as `max_tokens=`; `Agent.configured`), checked before it starts."""
        cls = cls.configured(**settings)
        if self._tg is None:
            raise InvalidRequest("use `async with Runtime(engine) as rt:` before spawning")
        name = name or cls.__name__.lower()
        if name in self._actors:
            raise InvalidRequest(f"an agent named {name!r} is already running")
        if cls.supervision not in SUPERVISION:
            raise InvalidRequest(f"{cls.__name__}.supervision must be one of {SUPERVISION}")
        if not (1 <= cls.max_concurrency <= MAX_CONCURRENCY and cls.mailbox_size >= 1):
            raise InvalidRequest(
                f"{cls.__name__}: max_concurrency must be 1 to {MAX_CONCURRENCY} and "
                f"mailbox_size at least 1 (got {cls.max_concurrency}, {cls.mailbox_size})"
            )
        if cls.system_visibility not in ("private", "public"):
            raise InvalidRequest(f"{cls.__name__}.system_visibility must be private or public")
        system = None
        if cls.system:
            seen = Private() if cls.system_visibility == "private" else Public()
            system = await self.engine.prefill(
                cls.system, role="system", owner=name, visibility=seen
            )
        send, recv = anyio.create_memory_object_stream[Envelope](cls.mailbox_size)
        actor = _Actor(name, cls, cls(name, self, system), send, recv)
        self._actors[name] = actor
        for _ in range(cls.max_concurrency):
            self._tg.start_soon(self._work, actor)
        self._trace("spawn", name, detail=cls.__name__)
        return name

    def stop(self, name: str) -> None:
        """Stop an agent and forget its name (queued messages become dead letters)."""
        actor = self._actor(name)
        self._stop(actor, f"{name} was stopped")
        prompt = actor.instance.system_prompt
        if prompt is not None and not prompt.freed:
            self.engine.free(prompt)
        del self._actors[name]
        for names in self._topics.values():
            if name in names:
                names.remove(name)

    def agent(self, name: str) -> Agent:
        return self._actor(name).instance

    def _actor(self, name: str) -> _Actor:
        actor = self._actors.get(name)
        if actor is None:
            raise UnknownAgent(f"no agent named {name!r}; spawn it first")
        return actor

    # ---- messaging ----

    async def ask(
        self,
        to: str,
        msg: Handle | BaseModel,
        *,
        timeout: float | None = None,
        sender: str | None = None,
        deltas: MemoryObjectSendStream[str] | None = None,
    ) -> Any:
        """Send and wait for the handler's result (its exception comes back as AgentError).

        Handles in the result are bound to `sender` (None: the runtime's caller).
        """
        envelope = Envelope(msg, sender, True, deltas=deltas, id=next(self._asks))
        self._trace("ask", to, peer=sender, ask=envelope.id, detail=describe(msg))
        try:
            with anyio.fail_after(timeout) if timeout is not None else nullcontext():
                try:
                    await self._deliver(to, envelope)
                except BaseException:
                    envelope.cancelled = True
                    raise
                return bind(await envelope.wait(), sender)
        except AskTimeout:  # a nested ask's, already named
            raise
        except TimeoutError:
            if timeout is None:
                raise
            raise AskTimeout(
                f"ask to agent {to!r} ({label(msg)}) got no reply within {timeout:g} s; "
                f"its handler was cancelled (raise the timeout, or check the handler)"
            ) from None

    async def ask_many(
        self,
        asks: Sequence[tuple[str, Handle | BaseModel]],
        *,
        timeout: float | None = None,
        sender: str | None = None,
    ) -> list[Any]:
        """Several asks at once (`(agent, message)` each), their results in order: the
        fan-out of a workflow, whose decodes the batching loop fuses. If any fails,
        the others still finish, and the first failure (in order) is raised as itself,
        the rest noted on it (`__notes__`), never an exception group."""
        results: list[Any] = [None] * len(asks)
        failed: dict[int, Exception] = {}

        async def one(i: int, to: str, msg: Handle | BaseModel) -> None:
            try:
                results[i] = await self.ask(to, msg, timeout=timeout, sender=sender)
            except Exception as exc:  # kept, so the other asks run to their end
                failed[i] = exc

        async with anyio.create_task_group() as tg:
            for i, (to, msg) in enumerate(asks):
                tg.start_soon(one, i, to, msg)
        if failed:
            first, *rest = (failed[i] for i in sorted(failed))
            for other in rest:
                first.add_note(f"also failed: {type(other).__name__}: {other}")
            raise first
        return results

    async def send(self, to: str, msg: Handle | BaseModel, *, sender: str | None = None) -> None:
        """Fire and forget; waits while the mailbox is full. Failures go to supervision."""
        envelope = Envelope(msg, sender, False, id=next(self._asks))
        self._trace("send", to, peer=sender, ask=envelope.id, detail=describe(msg))
        await self._deliver(to, envelope)

    def send_nowait(self, to: str, msg: Handle | BaseModel, *, sender: str | None = None) -> None:
        check_payload(msg)
        actor = self._actor(to)
        if actor.stopped:
            self._dead(to, msg, "the agent is stopped")
            return
        envelope = Envelope(msg, sender, False, id=next(self._asks))
        try:
            actor.send.send_nowait(envelope)
            self._trace("send", to, peer=sender, ask=envelope.id, detail=describe(msg))
        except anyio.WouldBlock:
            raise MailboxFull(
                f"{to}'s mailbox is full ({actor.cls.mailbox_size} messages); await send() "
                f"instead, or raise {actor.cls.__name__}.mailbox_size"
            ) from None

    def subscribe(self, topic: str, name: str) -> None:
        self._actor(name)
        if name not in self._topics[topic]:
            self._topics[topic].append(name)

    async def publish(
        self, topic: str, msg: Handle | BaseModel, *, sender: str | None = None
    ) -> None:
        """Send to every subscriber of topic; with none, the message is a dead letter."""
        check_payload(msg)
        names = self._topics.get(topic, [])
        if not names and topic != DEAD_LETTERS:
            self._dead(f"topic {topic}", msg, "no subscribers")
        for name in names:
            await self.send(name, msg, sender=sender)

    def ask_stream(
        self, to: str, msg: Handle | BaseModel, *, timeout: float | None = None
    ) -> AskStream:
        """`async for delta in rt.ask_stream(...)`: text deltas of every decode the handler
        (and nested streamed asks) makes; then `.result` is the handler's result.

        A handler failure is raised as AgentError once the deltas end; leaving the
        loop early cancels the ask.
        """
        return AskStream(self._start_ask, self.ask, to, msg, timeout)

    def _start_ask(
        self, to: str, msg: Handle | BaseModel, run: Callable[[], Awaitable[None]]
    ) -> None:
        """A streamed ask's task, checked first and started in the runtime's task group."""
        if self._tg is None:
            raise InvalidRequest("use `async with Runtime(engine) as rt:` before asking")
        check_payload(msg)
        self._actor(to)
        self._tg.start_soon(run)

    async def _deliver(self, to: str, envelope: Envelope) -> None:
        check_payload(envelope.message)
        actor = self._actor(to)
        if actor.stopped:
            reason = f"{to} is stopped"
            self._dead(to, envelope.message, reason)
            if envelope.expects_reply:
                raise AgentStopped(f"{reason}: cannot deliver {describe(envelope.message)}")
            return
        await actor.send.send(envelope)

    def _dead(self, to: str, msg: Handle | BaseModel, reason: str) -> None:
        letter = DeadLetter(to=to, message=msg, reason=reason)
        self.dead_letters.append(letter)
        self.dead_letter_count += 1
        self._trace("dead_letter", to, ok=False, detail=f"{describe(msg)}: {reason}")
        for name in self._topics.get(DEAD_LETTERS, []):
            actor = self._actors[name]
            if actor.stopped or isinstance(msg, DeadLetter):
                continue  # never let dead letters breed dead letters
            try:
                actor.send.send_nowait(Envelope(letter, None, False))
            except (anyio.WouldBlock, anyio.ClosedResourceError):
                pass  # the letter stays recorded in dead_letters

    # ---- the actor loop ----

    async def _work(self, actor: _Actor) -> None:
        async for envelope in actor.recv:
            if envelope.cancelled:
                continue
            token = current.set(envelope)
            wf_token = workflow_var.set(envelope.workflow)  # its calls carry the asker's
            run_token = run_var.set(envelope.run)  # ... and its recorded run
            envelope.started = True  # from here it replies on every path
            try:
                with envelope.scope:
                    message = bind(envelope.message, actor.name)  # what it may read, checked
                    result = await actor.instance.handle(message)
                    envelope.reply(result)
                    if envelope.expects_reply:
                        self._trace("reply", actor.name, peer=envelope.sender, ask=envelope.id)
                if envelope.scope.cancelled_caught and not envelope.done.is_set():
                    envelope.reply(error=AgentStopped(f"{actor.name}: the ask was cancelled"))
                    self._trace("reply", actor.name, ask=envelope.id, ok=False, detail="cancelled")
            except Exception as exc:
                self._failed(actor, envelope, exc)
            except BaseException:  # cancelled from outside: shutdown or escalation
                if not envelope.done.is_set():
                    envelope.reply(error=AgentStopped(f"{actor.name} stopped: runtime shut down"))
                raise
            finally:
                run_var.reset(run_token)
                workflow_var.reset(wf_token)
                current.reset(token)
            if actor.stopped:
                break

    def _failed(self, actor: _Actor, envelope: Envelope, exc: Exception) -> None:
        detail = f"{type(exc).__name__}: {exc}"
        error = AgentError(f"agent {actor.name!r} failed on {label(envelope.message)}: {detail}")
        error.__cause__ = exc
        if envelope.expects_reply:
            envelope.reply(error=error)
            self._trace(
                "reply", actor.name, peer=envelope.sender, ask=envelope.id, ok=False, detail=detail
            )
            return
        actor.failures.append(error)
        self._trace("failure", actor.name, peer=envelope.sender, ok=False, detail=detail)
        policy = actor.cls.supervision
        if policy == "restart" and actor.restarts < actor.cls.max_restarts:
            actor.restarts += 1  # fresh state, same (already encoded) system prompt
            actor.instance = actor.cls(actor.name, self, actor.instance.system_prompt)
            self._trace("restart", actor.name, detail=f"restart {actor.restarts}")
        elif policy == "escalate":
            self._escalated = error
            if self._rec.on:
                self._rec.emit(ErrorEvent(t=self._rec.now(), where=actor.name, detail=str(error)))
            self._tg.cancel_scope.cancel()
        else:
            self._stop(actor, f"{actor.name} stopped after: {exc}")

    def _stop(self, actor: _Actor, reason: str) -> None:
        """Close the mailbox; queued messages become dead letters (asks fail)."""
        if not actor.stopped:
            self._trace("stop", actor.name, detail=reason)
        actor.stopped = True
        actor.send.close()
        while True:
            try:
                envelope = actor.recv.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                break
            self._dead(actor.name, envelope.message, reason)
            if envelope.expects_reply:
                envelope.reply(error=AgentStopped(reason))
