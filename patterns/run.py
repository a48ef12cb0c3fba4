"""The bookkeeping every pattern shares: one `Run` per workflow execution.

A `Run` spawns the pattern's agents under names unique to the run (so many runs
can share one runtime and one engine), prefills instructions as the pattern
itself (public), sends decode turns to agents, records every message, parse
error and seed, and builds the `PatternResult`. When the run ends, however it
ends, its agents are stopped and its messages freed: their KV slots go back to
the store, while their text, parents and token counts stay readable through
the result's handles. Inside a recorded run (`Engine.recorded`, `corps run
--store --run`) its messages stay, and its agents' names derive from the recorded
run's name, so a run resumed under that name makes the same calls.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import time
import uuid
from collections.abc import Iterator
from typing import Any

import anyio
from pydantic import BaseModel, ConfigDict

from corps.agents import Agent, Runtime
from corps.cache.handle import Handle
from corps.cache.visibility import Private
from corps.engine.repair import LADDER, parse_repair
from corps.engine.request.workflow import CURRENT, RUN, Objective, Recorded, Workflow
from corps.engine.trace.events import Gate, Stage
from corps.patterns.replay import CURRENT as REPLAY
from corps.patterns.result import PatternResult

_GATED: contextvars.ContextVar[bool] = contextvars.ContextVar("gated", default=False)


@contextlib.contextmanager
def first_error() -> Iterator[None]:
    """Around a task group: if its tasks fail, raise the first failure as itself (a
    typed corps or agent error, not anyio's `ExceptionGroup`), the others noted on it."""
    try:
        yield
    except BaseExceptionGroup as group:
        leaves = _leaves(group)
        first = next((e for e in leaves if isinstance(e, Exception)), None)
        if first is None or len(leaves) != sum(isinstance(e, Exception) for e in leaves):
            raise  # a cancellation or exit among them: not ours to unwrap
        for other in leaves[1:]:
            first.add_note(f"also failed at the same time: {type(other).__name__}: {other}")
        raise first from None


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    out: list[BaseException] = []
    for e in group.exceptions:
        out += _leaves(e) if isinstance(e, BaseExceptionGroup) else [e]
    return out


class Turn(BaseModel):
    """One decode a pattern asks an agent for: what it attends to, where, and how."""

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)
    parents: tuple[Handle, ...]
    offsets: tuple[int | None, ...] | None = None
    new_offset: int | None = None
    header: str = ""
    max_tokens: int = 64
    temperature: float = 0.7
    top_p: float = 0.95
    seed: int | None = None
    stop: tuple[str, ...] = ()
    private: bool = False
    index: int = 0  # the turn's place in its run (keys a Replay)
    force: tuple[int, ...] = ()  # replayed tokens (equal-work benchmarks)
    logprobs: bool = False  # note each token's log-probability (fidelity, distillation)
    # at most one constraint on the text (corps.engine.request.constraint); None: free text
    regex: str | None = None
    json_schema: dict[str, Any] | None = None
    choices: tuple[str, ...] | None = None
    repair: str | None = None  # None: its agent's, workflow's or engine's (`Run.decision_repair`)
    final: bool = False  # no later turn reads the reply (DecodeArgs.final): not kept encoded

    def request(self) -> dict[str, Any]:
        """The turn as `DecodeArgs`. A forced turn leaves max_tokens out: the request
        takes it from the forced tokens (`corps.engine.request.requests.decode_request`)."""
        drop = {"private", "index", "force"} | ({"max_tokens"} if self.force else set())
        r = self.model_dump(exclude=drop)
        if self.force:
            r["force"] = self.force
        r["parents"] = list(self.parents)  # the handles themselves, bound to the agent
        if self.private:
            r["visibility"] = Private()
        return r


class Turns(BaseModel):
    model_config = ConfigDict(frozen=True)
    items: tuple[Turn, ...]


class Speaker(Agent):
    """A pattern's role: decodes the turns it is given, as itself, in one fused batch."""

    async def handle(self, turns: Turns) -> list[Handle]:
        return await self.decode_many([t.request() for t in turns.items])


class Run:
    """`async with Run(rt, "debate", max_tokens=..., ...) as run:` then `run.result(...)`."""

    def __init__(
        self,
        rt: Runtime,
        pattern: str,
        *,
        max_tokens: int,
        temperature: float,
        top_p: float,
        seed: int | None,
    ) -> None:
        self.rt = rt
        self.engine = rt.engine
        self.pattern = pattern
        self.max_tokens, self.temperature, self.top_p, self.seed = (
            max_tokens,
            temperature,
            top_p,
            seed,
        )
        recorded = RUN.get()  # a recorded run's agents have the same names when it resumes
        self.id = uuid.uuid4().hex[:8] if recorded is None else _recorded_id(recorded)
        self.messages: list[Handle] = []
        self.parse_errors: list[str] = []
        self.agents: list[str] = []
        self._calls = 0
        self._stage: str | None = None
        self._t0 = time.perf_counter()
        self.replay = REPLAY.get()
        self._ticket: int | None = None  # its pass through the engine's workflow gate

    async def __aenter__(self) -> Run:
        gate = self.engine.gate
        if gate is not None and not _GATED.get():  # a run inside a run: already in
            self._ticket = await gate.admit(self.pattern)  # when the store can hold it
            self._gated = _GATED.set(True)
            rec = self.engine.recorder
            if rec.on:
                waited = gate.wait_of(self._ticket)
                rec.emit(Gate(t=rec.now(), run=f"{self.pattern}-{self.id}", waited=waited))
        self._t0 = time.perf_counter()
        # every call of the run, its agents' included, carries the run as its workflow
        outer = CURRENT.get()  # inside `with engine.workflow(..., objective=...)`: its objective
        objective: Objective = outer.objective if outer is not None else "throughput"
        repair = outer.repair if outer is not None else None  # and its repair and audit
        audit = outer.audit if outer is not None else None
        self._workflow_repair = repair  # decides over the engine's (`decision_repair`)
        tag = Workflow(
            f"{self.pattern}-{self.id}", objective, repair, audit=audit, family=self.pattern
        )
        self._workflow = CURRENT.set(tag)
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        CURRENT.reset(self._workflow)
        held = 0
        try:
            if self._ticket is not None and exc_info[0] is None:  # its peak: it frees nothing
                held = self._held()  # before its end (a failed run's teaches nothing)
            for name in self.agents:
                self.rt.stop(name)
            if RUN.get() is None:  # a recorded run's messages stay in the store
                for h in self.messages:
                    if h is not None and not h.freed:
                        self.engine.free(h)
                # and what its agents made that it never received (a cancelled ask's reply)
                self.engine.free_owned(self.agents)
        finally:  # out of the gate whatever happened, so no run waits on this one forever
            if self._ticket is not None:
                _GATED.reset(self._gated)
                self.engine.gate.leave(self._ticket, self.pattern, held)

    def _held(self) -> int:
        """Store tokens this run holds now: its messages and its agents' own."""
        live = {h.id: h for h in self.messages if h is not None and not h.freed}
        mine = sum(h.length for h in live.values() if h.owner not in self.agents)
        return mine + self.engine.held_by(self.agents)

    # ---- building the workflow ----

    @property
    def decision_repair(self) -> str | None:
        """The repair for the pattern's decision steps (a tree of thoughts' voters, a
        debate's moderator and judge, map-reduce's reducer, branch-solve-merge's merger):
        the engine's `decision_repair` where neither the run's workflow nor its engine's
        `repair` names one, else None (the workflow's or engine's applies, as to every
        call). It is the turn's own repair, so it decides over the agent class's
        (the patterns' `Speaker` names none). Under "auto" the decision steps start
        auto's ladder at that rung ("auto:P") instead of at none. Judges and voters
        choose differently from the baseline's more often than the agents they judge
        (docs/fidelity.md)."""
        cfg = self.engine.config
        if cfg.mode != "choreographed" or cfg.decision_repair == "none":
            return None
        named = self._workflow_repair
        if named is None and cfg.repair == "none":
            return cfg.decision_repair
        policy = parse_repair(named if named is not None else cfg.repair)
        if policy.auto and policy.start is None and parse_repair(cfg.decision_repair) in LADDER:
            return f"auto:{cfg.decision_repair}"  # auto, the decision steps starting there
        return None

    async def agent(self, role: str, cls: type[Agent] = Speaker) -> str:
        """Spawn one of the pattern's agents; its name is unique to this run."""
        name = f"{self.pattern}-{self.id}-{role}"
        await self.rt.spawn(cls, name)
        self.agents.append(name)
        return name

    async def prefill(
        self,
        text: str,
        *,
        role: str = "user",
        parents: list[Handle] | tuple[Handle, ...] = (),
        offsets: list[int | None] | None = None,
        new_offset: int | None = None,
    ) -> Handle:
        """An instruction or input, encoded by the pattern itself (public)."""
        h = await self.engine.prefill(
            text, role=role, parents=list(parents), offsets=offsets, new_offset=new_offset
        )
        self.messages.append(h)
        return h

    async def prefill_many(self, items: list[dict[str, Any]]) -> list[Handle]:
        """Independent instructions or inputs at once (`Engine.prefill_many` items: message,
        role, parents, ...), in one batched step rather than one step each; handles in order."""
        handles = await self.engine.prefill_many(items)
        self.messages.extend(handles)
        return handles

    def turn(self, parents: list[Handle], **kw: Any) -> Turn:
        """A decode turn with the run's sampling settings and the next seed."""
        kw.setdefault("max_tokens", self.max_tokens)
        kw.setdefault("temperature", self.temperature)
        kw.setdefault("top_p", self.top_p)
        self._calls += 1
        seed = None if self.seed is None else self.seed * 100_003 + self._calls
        force = self.replay.force(self._calls) if self.replay else None
        if force:
            kw["force"] = force
        if self.replay is not None and self.replay.logprobs:
            kw["logprobs"] = True
        return Turn(parents=tuple(parents), seed=seed, index=self._calls, **kw)

    def record(self, index: int, handle: Handle) -> None:
        """Note what turn `index` decoded, for a Replay (run.ask does it for its turns)."""
        if self.replay is not None:
            self.replay.record(index, handle)

    def _record(self, turns: tuple[Turn, ...], handles: list[Handle]) -> None:
        for turn, h in zip(turns, handles, strict=True):
            self.record(turn.index, h)

    def stage(self, name: str) -> None:
        """Say which stage the workflow is in ("round 2"); the live view and traces
        show it, with the roles each ask goes to."""
        self._stage = name
        self._announce(None)

    def _announce(self, roles: list[str] | None) -> None:
        rec = self.engine.recorder
        if not rec.on:
            return
        who = ", ".join(r.removeprefix(f"{self.pattern}-{self.id}-") for r in roles or ())
        name = " · ".join(x for x in (self._stage, who) if x)
        rec.emit(Stage(t=rec.now(), run=f"{self.pattern}-{self.id}", name=name))

    async def ask(self, agent: str, *turns: Turn) -> list[Handle]:
        """`agent` decodes `turns` (fused); their handles, recorded in order."""
        self._announce([agent])
        handles = await self.rt.ask(agent, Turns(items=turns))
        self._record(turns, handles)
        self.messages.extend(handles)
        return handles

    async def parallel(self, calls: list[tuple[str, Turn]]) -> list[Handle]:
        """Turns for several agents at once (each agent's turns fused); handles in order."""
        by_agent: dict[str, list[int]] = {}
        for i, (agent, _) in enumerate(calls):
            by_agent.setdefault(agent, []).append(i)
        out: list[Handle | None] = [None] * len(calls)
        self._announce(list(by_agent))

        async def one(agent: str, idx: list[int]) -> None:
            handles = await self.rt.ask(agent, Turns(items=tuple(calls[i][1] for i in idx)))
            for i, h in zip(idx, handles, strict=True):
                out[i] = h

        with first_error():
            async with anyio.create_task_group() as tg:
                for agent, idx in by_agent.items():
                    tg.start_soon(one, agent, idx)
        self._record(tuple(turn for _, turn in calls), out)
        self.messages.extend(out)
        return out

    def error(self, what: str) -> None:
        """Record a parse failure (the pattern falls back and goes on)."""
        self.parse_errors.append(what)

    # ---- the result ----

    def result(self, answer: str | None, details: dict[str, Any]) -> PatternResult:
        ttfts = [h.ttft for h in self.messages if h.ttft is not None]
        return PatternResult(
            pattern=self.pattern,
            mode=self.engine.mode,
            answer=answer,
            details=details,
            messages=list(self.messages),
            parse_errors=list(self.parse_errors),
            tokens_encoded=sum(h.tokens_encoded for h in self.messages),
            tokens_reused=sum(h.tokens_reused for h in self.messages),
            wall_s=time.perf_counter() - self._t0,
            mean_ttft_s=sum(ttfts) / len(ttfts) if ttfts else None,
            leaks=sum(h.leaks for h in self.messages),
        )


def _recorded_id(recorded: Recorded) -> str:
    """The id of the next `Run` in a recorded run: the same each time the run is made
    again under its name, as long as it makes its Runs in the same order."""
    n, recorded.runs = recorded.runs, recorded.runs + 1
    return hashlib.blake2b(f"{recorded.name}/{n}".encode(), digest_size=4).hexdigest()
