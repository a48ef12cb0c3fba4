"""Which workflow a call belongs to, and what it is for: what scheduling policies read.

A workflow (a pattern's `Run`, or any code inside `with engine.workflow(name):`)
tags every call made in its context, however deep: the tag travels through
agents' mailboxes with each ask (`corps.agents.envelope`), so an agent's
decode carries the workflow that asked it. `objective` is "latency" (someone
waits on each token: chat, the last steps of an interactive workflow) or
"throughput" (a data set run, the default); a call's own `objective=` or its
agent's overrides it. `repair` (`corps.engine.repair`) is the repair policy of
the workflow's calls that name none (and whose agent names none); None: the
engine's; `audit` its audit rate (`corps.engine.audit`). Calls submitted
together (one `decode_many`, one `prefill_many`, an agent's fused turns) form
a task group, which the `workflow` and `objective` policies admit whole. In a
latency workflow, a call made alone is latency-critical and a task group's calls
are not (`corps.engine.api.submit.deduce_objective`).
"""

from __future__ import annotations

import contextvars
import itertools
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal, get_args

from corps.cache.errors import InvalidRequest
from corps.engine.audit import check_audit
from corps.engine.repair import Repair, parse_repair

Objective = Literal["latency", "throughput"]
OBJECTIVES: tuple[str, ...] = get_args(Objective)
_ids = itertools.count(1)


@dataclass(frozen=True)
class Workflow:
    """A workflow's tag: its name, objective, repair policy (None: the engine's), audit
    rate (None: the engine's; `corps.engine.audit`), family (the name audits and
    `repair="auto"` keep figures under: a pattern's runs share their pattern's;
    "" means the name) and when it started (perf_counter)."""

    name: str
    objective: Objective = "throughput"
    repair: Repair | None = None
    started: float = field(default_factory=time.perf_counter)
    id: int = field(default_factory=lambda: next(_ids))
    audit: int | None = None
    family: str = ""

    @property
    def kind(self) -> str:
        """What its figures are kept under: its family, else its name."""
        return self.family or self.name


#: The workflow of the code running now (None: calls made outside any workflow).
CURRENT: contextvars.ContextVar[Workflow | None] = contextvars.ContextVar(
    "corps_workflow", default=None
)


@dataclass
class Recorded:
    """A recorded run (`corps.engine.api.turns`): its name, and how many pattern runs
    were made in it so far (their agents' names derive from both)."""

    name: str
    runs: int = 0


#: The recorded run of the code running now (None: calls are not recorded). Agents'
#: calls carry their asker's, as they carry its workflow.
RUN: contextvars.ContextVar[Recorded | None] = contextvars.ContextVar("corps_run", default=None)


def check_objective(value: str | None) -> str | None:
    if value is not None and value not in OBJECTIVES:
        raise InvalidRequest(f"objective must be 'latency' or 'throughput', got {value!r}")
    return value


@contextmanager
def workflow(
    name: str,
    objective: Objective = "throughput",
    repair: str | Repair | None = None,
    audit: int | None = None,
    family: str = "",
) -> Iterator[Workflow]:
    """Tag every call made inside (and by agents asked from inside) with this workflow."""
    check_objective(objective)
    if not isinstance(name, str) or not isinstance(family, str):
        raise InvalidRequest("a workflow's name and family are strings")
    rep = None if repair is None else parse_repair(repair)
    tag = Workflow(name, objective, rep, audit=check_audit(audit), family=family)
    token = CURRENT.set(tag)
    try:
        yield tag
    finally:
        CURRENT.reset(token)
