"""The parts an `Engine` coordinates, built from its config: the batching loop, the
access guard, the submitter, the fidelity auditor, message lifetimes and the workflow
gate. Each owns its state; the engine only wires them and delegates."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from corps.engine.api.access import Guard
from corps.engine.api.audit import Auditor
from corps.engine.api.build import measured_settings
from corps.engine.api.lifetimes import Lifetimes
from corps.engine.api.submit import Submitter
from corps.engine.api.turns import Turns
from corps.engine.config import EngineConfig, step_tokens_for
from corps.engine.errors import InvalidRequest
from corps.engine.exec.executor import Executor
from corps.engine.repair import parse_repair
from corps.engine.sched.fair import tenant_figures
from corps.engine.sched.gate import WorkflowGate, gate_for
from corps.engine.sched.make import make as make_policy
from corps.engine.sched.scheduler import Scheduler
from corps.engine.stats import EngineStats
from corps.engine.trace.events import Recorder
from corps.engine.trace.exporter import LiveSpans


@dataclass(frozen=True)
class Parts:
    sched: Scheduler
    guard: Guard
    submit: Submitter
    auditor: Auditor
    lifetimes: Lifetimes
    gate: WorkflowGate | None  # None when off (`admission=False` and no `max_workflows`)

    def check(self, executor: Executor) -> None:
        """`Engine.check()`: the executor's bookkeeping, once nothing is in flight."""
        if not self.sched.idle:
            raise InvalidRequest("check() needs an idle engine: await your calls first")
        if self.auditor.in_flight:
            raise InvalidRequest(
                "check() needs an idle engine: fidelity audits' shadows are still running; "
                "await engine.fidelity_report() first"
            )
        executor.check()

    def stats(self, executor: Executor, cfg: EngineConfig, otel: LiveSpans | None) -> EngineStats:
        """`Engine.stats()`: the executor's figures with the loop's, the guard's, the
        auditor's and the span sender's."""
        self.lifetimes.sweep()
        return dataclasses.replace(
            executor.stats(),
            **self.sched.figures(),
            leaks=self.guard.leak_count,
            reencodes=self.guard.reencode_count,
            records=executor.table.records,
            spans_sent=otel.sent if otel is not None else 0,
            spans_dropped=otel.dropped if otel is not None else 0,
            policy=self.sched.policy.name,
            tenants=tenant_figures(
                self.sched.policy, self.sched.admission.held, self.sched.admission.running
            ),
            repair=cfg.repair,
            **self.auditor.figures(),
        )


def wire(
    executor: Executor,
    cfg: EngineConfig,
    recorder: Recorder,
    spawn: Callable[[Callable[[], Awaitable[Any]]], bool],
) -> Parts:
    """An engine's parts over `executor`, as `cfg` sets them; `spawn` starts a task in the
    engine's task group (the auditor's shadows)."""
    sched = Scheduler(
        executor,
        queue_size=cfg.queue_size,
        step_tokens=cfg.step_tokens or step_tokens_for(cfg.device),
        recorder=recorder,
        max_running=cfg.max_running,
        policy=make_policy(cfg.policy, **measured_settings(cfg.policy, executor)),
        evict=cfg.evict,
        run_ahead=cfg.run_ahead,
    )
    guard = Guard(executor.table, mode=executor.mode, policy=cfg.leak_policy, recorder=recorder)
    submit = Submitter(executor, sched, guard, recorder)
    submit.deduce = cfg.deduce_objectives
    auditor = Auditor(
        executor, recorder, repair=parse_repair(cfg.repair), audit=cfg.audit,
        budget=cfg.audit_budget, spawn=spawn, shadows=submit,
    )  # fmt: skip
    submit.auditor = auditor
    durable = executor.durable  # EngineConfig.store: recorded runs
    submit.turns = Turns(durable, executor.table) if durable is not None else None
    lifetimes = Lifetimes(executor, guard, recorder, auto_free=cfg.auto_free)
    return Parts(sched, guard, submit, auditor, lifetimes, gate_for(executor, cfg))
