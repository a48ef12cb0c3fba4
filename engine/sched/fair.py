"""`fair`: each tenant its share of the batching loop, whatever the others' load.

A call's tenant is whoever it names (`tenant=`; `corps serve` names its API key's
tenant; a call that names none is the one default tenant, ""). The policy keeps
each tenant's *service*: the tokens its calls encoded plus the tokens they
sampled (a generated token counts twice, once drawn and once encoded, as VTC
weighs output against input, Sheng et al., OSDI 2024), divided by the tenant's
weight and forgotten with a half-life of `half_life_s`: an idle tenant cannot bank
credit for longer than that, and a tenant's standing says what it received lately.
On top of `objective` (latency calls, task groups whole, aging, the bounded step
and victim order are its):

- **Order.** Waiting task groups are admitted, and running calls share a step's
  prompt budget, least-served tenant first (within `objective`'s classes: latency,
  aged, the rest). Under a backlog (calls waiting for `max_running` or memory) this
  gives backlogged tenants service in proportion to their weights.
- **Protection.** While two or more tenants have calls, a tenant whose standing
  is below `protect` of the mean standing of those tenants (it asks far less than
  its share) has its calls that have not reached their first token treated as
  critical latency calls: admitted first, and the steps that encode them bounded
  as `objective` bounds steps beside critical calls (the other calls sit out a
  step at most `starve_steps` in a row). So one tenant's load does not set
  another's time to first token.
- **Guard.** A protected tenant's next call cannot overtake the step already
  running when it comes. So while a tenant protected in the last `recent_s`
  seconds has no call running, each step of the others is kept within `guard_s`
  predicted seconds (once the loop has learnt what its steps cost): the calls
  that sit out a step go first in the next, and every step runs at least one.
  This trades some of the others' throughput (one step's fixed cost more per
  `guard_s`) for the protected tenant's time to first token.
- **Work-conserving.** With one tenant, or tenants of like standing, nothing is
  held back beyond `objective`'s own rules: every running call runs every step.

Forgetting (instead of VTC's counter lift when a client returns) keeps one
number per tenant and bounds what an idle tenant can claim on its return to
about `half_life_s` of its share.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from corps.engine.errors import InvalidRequest
from corps.engine.sched.policies import ObjectiveFirst, Policy, chunks_of, keys_of, rows_of

HALF_LIFE_S = 10.0  # seconds after which a tenant's service counts half
PROTECT = 0.5  # a tenant below this share of the mean standing is protected
#: while a tenant protected in the last RECENT_S seconds may send its next call, a step
#: is kept within GUARD_S predicted seconds: the step in flight when it comes is short
GUARD_S = 0.03
RECENT_S = 2.0
MAX_WEIGHT = 1000.0  # weights lie in [1 / MAX_WEIGHT, MAX_WEIGHT]
DEFAULT = ""  # the tenant of a call that names none


@dataclass
class Share:
    """One tenant's account: its weight, what it received and when last counted."""

    weight: float = 1.0
    served: float = 0.0  # tokens received, all time (encoded + sampled)
    standing: float = 0.0  # tokens received / weight, forgotten with the half-life
    at: float = 0.0  # when `standing` was last brought up to date
    protected: bool = False  # its first tokens go first (see the module's docstring)
    protected_at: float = -math.inf  # when it was last protected (the guard)


@dataclass
class FairShare(ObjectiveFirst):
    """`objective`, with tenants ordered and protected by the service they received."""

    half_life_s: float = HALF_LIFE_S
    protect: float = PROTECT
    guard_s: float | None = GUARD_S  # None: no guard
    recent_s: float = RECENT_S
    shares: dict[str, Share] = field(default_factory=dict)
    # the calls last seen waiting (`order`): with the running ones, the active tenants
    _waiting: list[Any] = field(default_factory=list, init=False, repr=False)
    _guard: bool = field(default=False, init=False, repr=False)  # the next step is guarded
    name = "fair"
    charges = True  # the loop tells it what each call received (`served`)

    def set_weights(self, weights: Mapping[str, float]) -> None:
        """Give each named tenant its weight (others keep theirs, 1 by default).
        InvalidRequest for a name that is not a string or a weight outside
        [1 / MAX_WEIGHT, MAX_WEIGHT]."""
        checked = {_tenant(t): _weight(w) for t, w in weights.items()}
        for tenant, w in checked.items():
            self._share(tenant).weight = w

    def standing(self, tenant: str, now: float | None = None) -> float:
        """The tenant's service per unit of weight, forgotten up to `now`."""
        share = self.shares.get(tenant)
        if share is None:
            return 0.0
        now = time.perf_counter() if now is None else now
        return share.standing * self._kept(now - share.at)

    def served(self, work: Sequence[tuple[Any, int]], now: float) -> None:
        """The step that ended at `now` gave each call `tokens` of service."""
        for call, tokens in work:
            share = self._share(tenant_of(call))
            share.standing = share.standing * self._kept(now - share.at) + tokens / share.weight
            share.served += tokens
            share.at = now

    def is_latency(self, call: Any) -> bool:
        return super().is_latency(call) or self._first(call)

    def is_critical(self, call: Any) -> bool:
        return super().is_critical(call) or self._first(call)

    def order(self, waiting: Sequence[Any], now: float) -> list[list[Any]]:
        self._waiting = list(waiting)
        return super().order(waiting, now)

    def _key(self, group: Sequence[Any], now: float) -> tuple:
        base = super()._key(group, now)
        return (base[0], self.standing(tenant_of(group[0]), now), *base[1:])

    def step_order(self, running: list[Any]) -> list[Any]:
        now = time.perf_counter()
        self._protect([*self._waiting, *running], now)
        self._waiting = []
        self._guard = self._guarding(running, now)
        standing = {t: self.standing(t, now) for t in {tenant_of(j) for j in running}}
        return sorted(running, key=lambda j: (
            not self.is_latency(j), standing[tenant_of(j)], -j.skipped, j.submitted,
        ))  # fmt: skip

    def step_calls(self, order: list[Any]) -> list[Any]:
        """Under the guard: the calls in order while the step's predicted seconds stay
        within `guard_s` (at least one); the others sit out this step. Otherwise as
        `objective`."""
        if not self._guard:
            return super().step_calls(order)
        chosen: list[Any] = []
        for j in order:
            rows = sum(rows_of(c) for c in chosen) + rows_of(j)
            if chosen and self._predict([*chosen, j], rows) > self.guard_s:  # type: ignore[operator]
                j.skipped += 1
                continue
            j.skipped = 0
            chosen.append(j)
        self._alone = None
        return chosen

    def step_budget(self, running: Sequence[Any], budget: int) -> int:
        """Under the guard: the rows that keep the step within `guard_s` (one per call at
        least). Otherwise as `objective`."""
        if not self._guard:
            return super().step_budget(running, budget)
        fits = self.cost.max_rows(len(running), chunks_of(running), self.guard_s, budget,  # type: ignore[union-attr]
                                  keys_of(running))  # fmt: skip
        return min(budget, max(len(running), fits or 0))

    def figures(self, now: float | None = None) -> dict[str, dict[str, float]]:
        """Each tenant's weight, service received, standing and protection (as numbers).
        Safe from another thread than the loop's (a copy of the accounts is read)."""
        now = time.perf_counter() if now is None else now
        return {
            t: {"weight": s.weight, "served": s.served, "standing": self.standing(t, now),
                "protected": float(s.protected)}
            for t, s in list(self.shares.items())
        }  # fmt: skip

    def _protect(self, calls: Sequence[Any], now: float) -> None:
        """Mark the tenants below `protect` of the mean standing of the tenants with
        calls in `calls` (none when fewer than two have calls)."""
        active = {tenant_of(j) for j in calls}
        for share in self.shares.values():
            share.protected = False
        if len(active) < 2:
            return
        standing = {t: self.standing(t, now) for t in active}
        mean = sum(standing.values()) / len(standing)
        for t, s in standing.items():
            share = self._share(t)
            share.protected = s < self.protect * mean
            if share.protected:
                share.protected_at = now

    def _guarding(self, running: Sequence[Any], now: float) -> bool:
        """Whether the guard bounds the next step: a tenant protected within `recent_s`
        has no call running, no critical call runs, and the step cost is learnt."""
        if self.guard_s is None or self.cost is None or not self.cost.ready:
            return False
        recent = {t for t, s in self.shares.items() if now - s.protected_at < self.recent_s}
        if not recent or any(self.is_critical(j) for j in running):
            return False
        return not any(tenant_of(j) in recent for j in running)

    def _first(self, call: Any) -> bool:
        """A call of a protected tenant that has not reached its first token."""
        share = self.shares.get(tenant_of(call))
        if share is None or not share.protected or call.first_token is not None:
            return False
        return not call.generated

    def _share(self, tenant: str) -> Share:
        share = self.shares.get(tenant)
        if share is None:
            share = self.shares[tenant] = Share()
        return share

    def _kept(self, elapsed: float) -> float:
        return 0.5 ** (max(0.0, elapsed) / self.half_life_s)


def tenant_of(call: Any) -> str:
    """The tenant a call's request names ("" for none)."""
    return getattr(call.request, "tenant", None) or DEFAULT


def _tenant(name: Any) -> str:
    if not isinstance(name, str) or len(name) > 200:
        raise InvalidRequest("tenant names must be strings of at most 200 characters")
    return name


def _weight(value: Any) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or not 1 / MAX_WEIGHT <= value <= MAX_WEIGHT:
        raise InvalidRequest(
            f"a tenant's weight must be a number from {1 / MAX_WEIGHT} to {MAX_WEIGHT:g}"
        )
    return float(value)


def tenant_figures(policy: Policy, held: Sequence[Any], running: Sequence[Any]) -> dict:
    """`EngineStats.tenants`: the fair policy's figures per tenant, with its calls
    `held` (waiting) and `running` now; empty under another policy."""
    if not isinstance(policy, FairShare):
        return {}
    out = policy.figures()
    for key, calls in (("waiting", held), ("running", running)):
        for call in list(calls):
            row = out.setdefault(tenant_of(call), {})
            row[key] = row.get(key, 0.0) + 1
    return out
