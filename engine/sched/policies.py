"""Scheduling policies: in which order waiting calls are admitted, and which may run.

The batching loop (`corps.engine.sched.scheduler`) asks its policy, before each step,
for the waiting calls as task groups in admission order (`order`), whether a
group may start now beside the running calls (`may_admit`), and in which order
the running calls share the step's token budget (`step_order`: decodes always
get their token; prefill chunks fill the rest in that order). Admission stays
head-of-line: a group that cannot get its memory holds everything behind it, so
nothing is overtaken forever. Each policy reads only what a call carries: when
it was submitted, its task group, its workflow (and when that started) and its
objective (`corps.engine.request.workflow`).

- `fcfs`: first come, first served, call by call (the loop's behaviour before
  policies existed).
- `workflow`: calls of workflows that started earlier go first (a workflow in
  flight finishes before new ones take the engine: lower latency per workflow at
  the same throughput); a task group is admitted whole; a call that has waited
  `aging_s` goes first whatever its workflow, so nothing starves.
- `objective`: latency calls first (and first in each step's prefill budget);
  while any critical latency call waits or runs, throughput calls are admitted
  only while fewer than `latency_batch` calls run, and while one runs a step
  encodes at most `latency_prefill` prompt tokens beside the decodes: both bound
  the step and so the critical calls' time per token; throughput calls fill the
  rest, as in `workflow`, and age like it. Where the engine measured its
  kernels (dtype auto on a CPU), both bounds are one: a step beside critical
  calls holds as many rows as keep its products within `LATENCY_SLOWDOWN` of a
  lone decode's (`latency_rows`). Once the loop has learnt what its steps cost
  (`corps.engine.sched.cost`, from the steps it ran: products, attention and
  per-call work alike), that replaces both: beside critical calls a step
  advances the latency calls and, oldest workflow first, as many throughput
  calls and prompt tokens (latency prompts first) as keep its
  predicted time within `STEP_SLOWDOWN` of the latency calls' step alone
  (`step_bound`, `step_calls`, `step_budget`); the other running calls
  sit that step out, keeping their place and memory (never more than
  `STARVE_STEPS` steps in a row). How much of that headroom they may use is
  steered by the measured wall times of those steps against the latency calls'
  step alone, measured too (`corps.engine.sched.feedback`: the prediction of a
  small step is the least reliable, and a step's wall holds more than its
  forward). A latency call is critical unless it
  is one of a latency workflow's task groups (`corps.engine.api.submit.deduce_objective`):
  such a group goes first but leaves the batch open, since what counts is when
  the whole group ends.

When the store is full and nothing running will give memory back, a call is
admitted by evicting encodings no running call reads (`corps.engine.exec.memory`);
the policy orders the candidates (`victims`): `fcfs` drops the least recently
read first; `workflow` and `objective` drop those of the workflow that started
last first (it yields to the ones ahead of it, as in admission), least recently
read first within a workflow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, get_args

from corps.engine.config import PolicyName
from corps.engine.exec.step_plan import decode_keys
from corps.engine.sched.cost import StepCost
from corps.engine.sched.feedback import StepFeedback

POLICIES: tuple[str, ...] = get_args(PolicyName)
AGING_S = 5.0  # seconds a call waits before it goes first under any policy
LATENCY_BATCH = 8  # calls running at most beside latency calls (objective)
#: Prompt tokens a step may encode beside running latency calls (objective): a 512-token
#: prefill chunk in the same step multiplies its time, which every latency call waits.
LATENCY_PREFILL = 64
#: Where the engine measured its product kernels (dtype auto on a CPU), a step beside
#: critical calls holds as many rows as keep its products within this factor of one
#: row's (`tuning.rows_within`), decodes and prompt tokens together.
LATENCY_SLOWDOWN = 1.5
#: Once the engine has learnt what its steps cost (`corps.engine.sched.cost`), a step
#: beside critical calls is kept within this factor of their step alone: their time
#: per token also holds the loop's fixed cost and the steps' spread, so this sits
#: below the 1.5x a user would accept.
STEP_SLOWDOWN = 1.3
#: Beside critical calls a throughput call may sit out at most this many steps in a
#: row (about a chat reply's worth), then it runs in the next whatever it costs.
STARVE_STEPS = 64


class Policy(Protocol):
    name: str
    charges: bool  # wants `served` after every step (the `fair` policy)

    def order(self, waiting: Sequence[Any], now: float) -> list[list[Any]]:
        """The waiting calls as task groups, in the order to admit them."""

    def may_admit(
        self, group: Sequence[Any], running: Sequence[Any], waiting: Sequence[Any], now: float
    ) -> bool:
        """Whether `group` may start at `now` beside `running` (others still `waiting`)."""

    def step_order(self, running: list[Any]) -> list[Any]:
        """The running calls in the order they share a step's prefill budget."""

    def step_calls(self, order: list[Any]) -> list[Any]:
        """Of the running calls in `step_order`, those the next step advances (the
        others keep their place and wait a step)."""

    def step_budget(self, running: Sequence[Any], budget: int) -> int:
        """Tokens the next step may run (of the engine's `budget`), for the calls
        `step_calls` chose."""

    def observe(
        self, calls: int, rows: int, seconds: float, chunks: int = 0, keys: int = 0
    ) -> None:
        """A step ran `calls` calls over `rows` rows in `seconds`, `chunks` of the
        calls encoding prompt chunks, its decodes attending over `keys` keys."""

    def stepped(self, wall: float) -> None:
        """The step `step_calls` last chose ran, taking `wall` seconds as its calls
        waited for it (admission, the forward and the hop back to the loop)."""

    def victims(self, candidates: list[Any]) -> list[Any]:
        """Messages whose encodings may be evicted, in the order they should go."""

    def served(self, work: Sequence[tuple[Any, int]], now: float) -> None:
        """The step that ended at `now` gave each call its tokens of service (called
        only where `charges`)."""

    def is_critical(self, call: Any) -> bool:
        """Whether `call` bounds the batch (and the loop waits a few turns for its
        successor when it ends)."""


class _Unbounded:
    """Steps as the loop plans them: every running call, the engine's whole budget,
    nothing learnt from the steps run."""

    charges = False

    def served(self, work: Sequence[tuple[Any, int]], now: float) -> None:
        pass

    def is_critical(self, call: Any) -> bool:
        return call.critical

    def step_calls(self, order: list[Any]) -> list[Any]:
        return order

    def step_budget(self, running: Sequence[Any], budget: int) -> int:
        return budget

    def observe(
        self, calls: int, rows: int, seconds: float, chunks: int = 0, keys: int = 0
    ) -> None:
        pass

    def stepped(self, wall: float) -> None:
        pass


class Fcfs(_Unbounded):
    """First come, first served, call by call."""

    name = "fcfs"

    def order(self, waiting: Sequence[Any], now: float) -> list[list[Any]]:
        return [[j] for j in sorted(waiting, key=lambda j: j.submitted)]

    def may_admit(self, group, running, waiting, now: float) -> bool:
        return True

    def step_order(self, running: list[Any]) -> list[Any]:
        return running

    def victims(self, candidates: list[Any]) -> list[Any]:
        return least_recent(candidates)


def least_recent(candidates: list[Any]) -> list[Any]:
    """Messages no call has read for longest first (the default victim order)."""
    return sorted(candidates, key=lambda m: m.read_at)


def groups_of(waiting: Sequence[Any]) -> list[list[Any]]:
    """Calls bucketed by task group, each in submission order, groups by first arrival."""
    out: dict[int, list[Any]] = {}
    for j in sorted(waiting, key=lambda j: j.submitted):
        out.setdefault(j.group, []).append(j)
    return list(out.values())


def _started(group: Sequence[Any]) -> float:
    """When the group's workflow started (its first call, outside any workflow)."""
    return started(group[0])


def started(call: Any) -> float:
    """When a call's workflow started (the call's own submission, outside any)."""
    return call.workflow.started if call.workflow is not None else call.submitted


@dataclass
class WorkflowFirst(_Unbounded):
    """Earlier workflows first; task groups whole; aged calls first of all."""

    aging_s: float = AGING_S
    name = "workflow"

    def _key(self, group: Sequence[Any], now: float) -> tuple:
        first = group[0].submitted
        if now - first >= self.aging_s:
            return (0, first)  # aged: by arrival, ahead of everything else
        return (1, _started(group), first)

    def order(self, waiting: Sequence[Any], now: float) -> list[list[Any]]:
        return sorted(groups_of(waiting), key=lambda g: self._key(g, now))

    def may_admit(self, group, running, waiting, now: float) -> bool:
        return True

    def step_order(self, running: list[Any]) -> list[Any]:
        return sorted(running, key=lambda j: (_started([j]), j.submitted))

    def victims(self, candidates: list[Any]) -> list[Any]:
        """The latest-started workflow's messages first: it yields to earlier ones."""
        return sorted(candidates, key=lambda m: (-m.started, m.read_at))


@dataclass
class ObjectiveFirst(WorkflowFirst):
    """Latency calls first, with the batch bounded while they are about."""

    latency_batch: int = LATENCY_BATCH
    latency_prefill: int = LATENCY_PREFILL
    # rows a step may hold beside critical calls, from measured kernel timings
    # (`Engine.open` sets it where it has them); None: the two bounds above
    latency_rows: int | None = None
    # what a step costs, learnt from the steps run (None: do not learn, use the bounds
    # above); once it predicts, it bounds the steps beside critical calls instead
    cost: StepCost | None = field(default_factory=StepCost)
    step_slowdown: float = STEP_SLOWDOWN
    # steers how much of the bound's headroom throughput calls use by the measured
    # walls of the steps beside critical calls (None: all of it, always)
    feedback: StepFeedback | None = field(default_factory=StepFeedback)
    starve_steps: int = STARVE_STEPS
    # of the step last chosen: whether it ran the latency calls alone (None: no
    # critical call in it), for `stepped`
    _alone: bool | None = field(default=None, init=False, repr=False)
    name = "objective"

    def is_latency(self, call: Any) -> bool:
        """Whether `call` goes first, as a latency call (its objective)."""
        return call.objective == "latency"

    def is_critical(self, call: Any) -> bool:
        """Whether `call` bounds the batch while it waits or runs."""
        return call.critical

    def _key(self, group: Sequence[Any], now: float) -> tuple:
        if self.is_latency(group[0]):
            return (-1, group[0].submitted)
        return super()._key(group, now)

    def may_admit(self, group, running, waiting, now: float) -> bool:
        if self.is_latency(group[0]):
            return True
        critical = any(self.is_critical(j) for j in [*running, *waiting])
        if not critical or now - group[0].submitted >= self.aging_s:  # aged: not held back
            return True
        cap = self.latency_batch if self.latency_rows is None else self.latency_rows
        return len(running) + len(group) <= cap

    def step_order(self, running: list[Any]) -> list[Any]:
        return sorted(running, key=lambda j: (not self.is_latency(j), _started([j])))

    def step_calls(self, order: list[Any]) -> list[Any]:
        """Beside running critical calls, once the step cost is learnt: every latency
        call, then each throughput call in order (a row each) whose step, predicted
        with the calls already chosen, stays within `step_bound`: one that does not
        fit is passed over, and a later one over a shorter view may still fit; a
        throughput call left out of `starve_steps` steps in a row runs in the next
        whatever it costs, so none starves. When the feedback asks for a probe, the
        latency calls run alone (but for starving calls), to measure their step
        alone. Otherwise every call."""
        bound = self.step_bound(order)
        latency = [j for j in order if self.is_latency(j)]
        own = sum(rows_of(j) for j in latency)
        chosen = list(latency)
        if bound is None and self.feedback is not None:
            self.feedback.reset()  # the next critical calls measure their own step alone
        if bound is None or len(latency) == len(order):
            for j in order:
                j.skipped = 0
            chosen = order
        else:
            probe = self.feedback is not None and self.feedback.probe()
            for j in order:
                if self.is_latency(j):
                    continue
                calls = [*chosen, j]
                over = probe or self._predict(calls, own + len(calls) - len(latency)) > bound
                if over and j.skipped < self.starve_steps:
                    j.skipped += 1
                    continue  # a later call may still fit (a shorter view costs less)
                j.skipped = 0
                chosen.append(j)
        self._alone = None if bound is None else len(chosen) == len(latency)
        return chosen

    def step_budget(self, running: Sequence[Any], budget: int) -> int:
        """Beside running critical calls: once the step cost is learnt, the latency
        calls' rows, every other call's token, and prompt tokens while the step's
        predicted seconds stay within `step_bound`; before that, at most
        `latency_prefill` prompt tokens (latency prompts go first, step_order), or
        with `latency_rows`, at most that many rows in all. Never fewer than one row
        per call."""
        if not any(self.is_critical(j) for j in running):
            return budget
        n = len(running)
        bound = self.step_bound(running)
        if bound is not None:
            own = sum(rows_of(j) for j in running if self.is_latency(j))
            least = own + sum(not self.is_latency(j) for j in running)
            keys = keys_of(running)
            fits = self.cost.max_rows(n, chunks_of(running), bound, budget, keys)  # type: ignore[union-attr]
            return min(budget, max(least, fits or 0))
        if self.latency_rows is not None:
            return min(budget, max(n, self.latency_rows))
        return min(budget, n + self.latency_prefill)

    def step_bound(self, running: Sequence[Any]) -> float | None:
        """Seconds a step may take beside the running critical calls: the predicted
        step of the latency calls alone (their tokens and prompt chunks), plus the
        feedback's `share` of the headroom `step_slowdown` allows above it (all of
        it without feedback). None when no critical call runs or the step cost is
        not learnt yet."""
        if not any(self.is_critical(j) for j in running):
            return None
        latency = [j for j in running if self.is_latency(j)]
        alone = self._predict(latency, sum(rows_of(j) for j in latency))
        if alone is None:
            return None
        share = 1.0 if self.feedback is None else self.feedback.share
        return alone * (1.0 + (self.step_slowdown - 1.0) * share)

    def stepped(self, wall: float) -> None:
        """With critical calls: a step of the latency calls alone measures their step
        alone; every such step steers the feedback's share
        (`corps.engine.sched.feedback`)."""
        alone, self._alone = self._alone, None
        if self.feedback is None or alone is None:
            return
        self.feedback.observe(wall, alone)

    def observe(
        self, calls: int, rows: int, seconds: float, chunks: int = 0, keys: int = 0
    ) -> None:
        if self.cost is not None:
            self.cost.observe(calls, rows, seconds, chunks, keys)

    def _predict(self, calls: Sequence[Any], rows: int) -> float | None:
        """Predicted seconds of a step running `calls` over `rows` rows."""
        if self.cost is None or not calls:
            return None
        return self.cost.predict(len(calls), rows, chunks_of(calls), keys_of(calls))


def rows_of(call: Any) -> int:
    """Rows a running call brings to the next step (`Call.rows`)."""
    return call.rows


def chunks_of(calls: Sequence[Any]) -> int:
    """Calls of `calls` that bring a prompt chunk (more than one row) to the next step."""
    return sum(rows_of(j) > 1 for j in calls)


def keys_of(calls: Sequence[Any]) -> int:
    """Keys the one-row calls of `calls` attend over in the next step (`decode_keys`)."""
    return decode_keys([j.keys for j in calls if j.rows == 1])
