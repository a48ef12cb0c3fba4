"""`Auditor`: the online fidelity audit and `repair="auto"`, at submission.

Every call passes `resolve` as it is submitted: its repair policy is settled (the
call's, else its workflow's, else the engine's; "auto" becomes the policy its
workflow and agent are at now, `corps.engine.auto_repair`) and, for a
choreographed decode that reads parents, whether it is audited (its audit rate:
the call's, else its agent's, else its workflow's, else the engine's; 1 in N
per workflow family and agent, the first of each N; a call whose turn comes
while the audits' token budget is spent passes it to the next call of its key
the budget allows). An audited call keeps the
model's distribution at its first `AUDIT_POSITIONS` sampled positions
(`Call.keep`), and its parents stay pinned for its shadow.

When an audited call ends, its shadow runs as a task of the engine: a prefill of
the call's header and first tokens after its parents' text laid end to end from
the start, each rewired parent recomputed in that context (`repair="full"` at
the default offsets: what the baseline encodes), keeping its own tokens'
logits; then it is freed. The gap and agreement between the two
(`corps.engine.audit`) are recorded, traced, and fed to the auto controller.
The audited call's result is returned before its shadow runs and never
changes; a shadow that fails (the engine closing, the store full) is dropped
and counted, and leaves nothing behind.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any, Protocol

import anyio
import torch

from corps.cache.handle import Handle
from corps.cache.messages import Message
from corps.engine.audit import (
    AUDIT_BUDGET,
    AUDIT_BURST,
    AUDIT_POSITIONS,
    Audit,
    AuditBook,
    AuditKey,
    AuditReport,
)
from corps.engine.auto_repair import AUTO_AUDIT, AutoRepair
from corps.engine.exec.call import Call
from corps.engine.exec.executor import Executor
from corps.engine.repair import Repair, parse_repair
from corps.engine.request.requests import DecodeRequest, PrefillRequest
from corps.engine.request.workflow import Workflow
from corps.engine.trace.events import Audited, Recorder, RepairSwitch

FULL = parse_repair("full")


class Shadows(Protocol):
    """How the auditor submits its shadows (`corps.engine.api.submit.Submitter`)."""

    def shadow_call(self, request: PrefillRequest, pins: list[Message]) -> Call: ...

    async def run(self, call: Call) -> Handle: ...


class Auditor:
    """The audits and auto repairs of one engine."""

    def __init__(
        self,
        executor: Executor,
        recorder: Recorder,
        *,
        repair: Repair,
        audit: int,
        budget: float = AUDIT_BUDGET,
        spawn: Callable[[Callable[[], Any]], bool],
        shadows: Shadows,
    ) -> None:
        self.executor, self.recorder, self.shadows = executor, recorder, shadows
        self.default_repair, self.default_audit, self.budget = repair, audit, budget
        self.due: set[tuple[str, str]] = set()  # keys whose next call is to be audited
        self.spent = 0  # tokens the shadows encoded
        # the token bucket: budget x the engine's other work fills it (to AUDIT_BURST, or
        # the shadow at hand), a shadow takes its bound from it and gives back the rest
        self.bucket = 0.0
        self.work = 0  # the engine's other work when the bucket was last filled
        self.spawn = spawn  # starts a task in the engine's task group (False: not running)
        self.book = AuditBook()
        self.auto = AutoRepair()
        self.seen: dict[tuple[str, str], itertools.count] = {}  # decodes per key
        self.failed = 0  # shadows that could not run (the engine closed, no room)
        self.in_flight = 0
        self._idle = anyio.Event()
        self._idle.set()

    # ---- at submission ----

    def resolve(
        self, request: PrefillRequest | DecodeRequest, wf: Workflow | None
    ) -> tuple[PrefillRequest | DecodeRequest, bool]:
        """The request with its repair policy settled, and whether "auto" chose it."""
        repair = request.repair
        if repair is None and wf is not None:
            repair = wf.repair
        named = repair or self.default_repair
        auto = named.auto
        if auto:
            repair = self.auto.policy(_kind(wf), _agent(request.owner, wf), named.start)
        if repair is not request.repair:
            request = dataclasses.replace(request, repair=repair)
        return request, auto

    def enlist(self, call: Call, auto: bool) -> None:
        """Audit this call if its turn has come: it keeps its first distributions, its
        parents are pinned for the shadow, and the shadow runs once it ends."""
        request = call.request
        if self.executor.mode != "choreographed" or not isinstance(request, DecodeRequest):
            return
        if not request.parents:  # nothing reused: nothing to compare
            return
        every = self.rate(request, call.workflow, auto)
        if not every:
            return
        key = (_kind(call.workflow), _agent(request.owner, call.workflow))
        if not next(self.seen.setdefault(key, itertools.count())) % every:
            self.due.add(key)  # its turn: this call, or the next one the budget allows
        cost = sum(len(m.tokens) for m in call.pins) + AUDIT_POSITIONS  # at most
        if key not in self.due or not self._affords(cost):
            return
        pins = self.executor.pin(call.pins)  # kept for the shadow past the call's end
        if not self.spawn(lambda: self._shadow_after(call, pins, auto, cost)):
            self.executor.unpin(pins)  # the engine is not running: nothing to audit with
            self._refund(cost)
            return
        self.due.discard(key)
        call.keep = AUDIT_POSITIONS
        self.in_flight += 1
        if self._idle.is_set():
            self._idle = anyio.Event()

    def _affords(self, cost: int) -> bool:
        """Whether a shadow of at most `cost` tokens fits the budget: the bucket holds
        `budget` x the tokens the engine encoded for everything else since it was last
        filled, up to AUDIT_BURST (or `cost`, so that no shadow waits forever), and
        the shadow takes `cost` from it. Over any stretch of time the shadows encode
        at most `budget` x the other work, plus one burst."""
        if self.budget >= 1.0:
            return True
        work = self.executor.stats().tokens_encoded - self.spent
        fill = self.budget * max(0, work - self.work)
        self.bucket = min(self.bucket + fill, max(AUDIT_BURST, cost))
        self.work = work
        if cost > self.bucket:
            return False
        self.bucket -= cost
        return True

    def _refund(self, tokens: int) -> None:
        if self.budget < 1.0:
            self.bucket = min(self.bucket + tokens, max(AUDIT_BURST, self.bucket))

    def rate(self, request: DecodeRequest, wf: Workflow | None, auto: bool) -> int:
        """1 in how many such calls are audited (0: none)."""
        for given in (request.audit, wf.audit if wf is not None else None):
            if given is not None:
                return given
        return self.default_audit or (AUTO_AUDIT if auto else 0)

    # ---- the shadow ----

    async def _shadow_after(self, call: Call, pins: list[Message], auto: bool, cost: int) -> None:
        try:
            await call.ended.wait()
            if call.error is None and not call.cancelled and call.kept:
                await self._compare(call, pins, auto, cost)
        except Exception:  # the engine closed, or no room: the audit is dropped
            self.failed += 1
            self._refund(cost)
        finally:
            if pins:
                self.executor.unpin(pins)
            self.in_flight -= 1
            if not self.in_flight:
                self._idle.set()

    async def _compare(self, call: Call, pins: list[Message], auto: bool, cost: int) -> None:
        request = call.request
        last = max(p for p, _ in call.kept)
        header = call.plan.prefix[len(call.plan.prefix) - call.plan.own :]
        shadow = PrefillRequest(
            list(header) + call.generated[:last],
            role=request.role,
            parents=request.parents,
            frame=False,
            owner=request.owner,
            visibility=request.visibility,
            repair=FULL,
        )
        scall = self.shadows.shadow_call(shadow, list(pins))  # it holds the pins now
        pins.clear()
        scall.want_logits = True
        handle = await self.shadows.run(scall)
        try:
            rows = torch.cat(scall.logits)  # (own, V): row i predicts own token i + 1
            gap, agree = _gap(call.kept, rows, len(header))
            tokens = sum(scall.spans) + scall.repaired
        finally:
            self.executor.free(handle)
        wf = call.workflow
        key = AuditKey(_kind(wf), _agent(request.owner, wf), str(request.repair or "none"))
        audit = Audit(call.id, key, len(call.kept), gap, agree, tokens)
        self.spent += tokens
        self._refund(cost - tokens)  # what it left of its bound (or took beyond it)
        self.book.add(audit)
        self._trace(audit, scall.id)
        if auto:
            switch = self.auto.observe(key.workflow, key.agent, gap)
            if switch is not None and self.recorder.on:
                self.recorder.emit(
                    RepairSwitch(t=self.recorder.now(), **dataclasses.asdict(switch))
                )

    def _trace(self, a: Audit, shadow: int) -> None:
        rec = self.recorder
        if rec.on:
            rec.emit(Audited(
                t=rec.now(), call=a.call_id, shadow=shadow, workflow=a.key.workflow,
                agent=a.key.agent, repair=a.key.repair, positions=a.positions, gap=a.gap,
                agreement=a.agreement, tokens=a.tokens,
            ))  # fmt: skip

    async def settled(self) -> None:
        """Wait until no shadow is running or waiting for its call."""
        await self._idle.wait()

    def report(self) -> AuditReport:
        return AuditReport(
            tuple(self.book.rows()), self.book.total(), self.failed, self.auto.chosen()
        )

    def figures(self) -> dict[str, Any]:
        """The audit's share of `EngineStats`."""
        t = self.book.total()
        return dict(
            audited=t.calls, audit_gap=t.gap, audit_agreement=t.agreement,
            audit_tokens=t.tokens, audits_failed=self.failed,
        )  # fmt: skip


def _kind(wf: Workflow | None) -> str:
    return wf.kind if wf is not None else ""


def _agent(owner: str | None, wf: Workflow | None) -> str:
    """The agent a call's figures go under: its owner, less its workflow's name where
    the owner is named after it (a pattern's agents are "<run>-<role>": every run's
    voters are one key)."""
    owner = owner or ""
    if wf is not None and owner.startswith(wf.name + "-"):
        return owner[len(wf.name) + 1 :]
    return owner


def _gap(kept, rows, header: int) -> tuple[float, float]:
    """Mean KL(baseline || choreographed) per kept position and the share of positions
    whose argmax agree. `kept`: (position p, choreographed log-softmax row (V,));
    `rows`: the shadow's own logits (own, V), where row header + p - 1 predicts
    generated token p."""
    at = torch.tensor([header + p - 1 for p, _ in kept], device=rows.device)
    base = torch.log_softmax(rows.index_select(0, at).float(), dim=-1)  # (P, V)
    chor = torch.stack([r for _, r in kept]).to(base.device)  # (P, V)
    p = base.exp()
    kl = torch.where(p > 0, p * (base - chor), 0.0).sum(-1)  # (P,); 0 log 0 = 0
    agree = (base.argmax(-1) == chor.argmax(-1)).float()
    return float(kl.mean()), float(agree.mean())
