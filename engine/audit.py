"""The online fidelity audit's figures: how far choreographed calls are from the baseline.

With `audit=N` (`EngineConfig.audit`, `engine.workflow(name, audit=N)`, an agent's
`audit`, or a call's `audit=`; the first that names one applies), one decode in N
of each workflow and agent is also run as the baseline would run it: a *shadow*
call encodes the text of the call's parents end to end, in order, and the call's
header and first tokens after them (`corps.engine.api.audit`). Where the two
disagree is what choreography changed for that call. Per audited call, over its
first `AUDIT_POSITIONS` sampled positions:

- `gap`: the mean KL divergence KL(baseline || choreographed) of the next-token
  distributions (nats per token). `corps fidelity`'s gap (the log-loss of the
  baseline's own temperature-1 samples under each mode, replay minus baseline)
  estimates the same quantity from samples;
- `agreement`: the share of positions where both modes' most likely token is the
  same (`corps fidelity`'s "agree").

A shadow encodes what the baseline would for that call (its rewired context),
so its cost is set by a token budget as well as by N: over any stretch of time
the shadows encode at most `AUDIT_BUDGET` (5%) of the tokens the engine encoded
for everything else, plus one burst (`AUDIT_BURST`, a token bucket), and an
audit that is due when the bucket is short goes to the next call of its key
that fits. The audited call returns its choreographed result unchanged and at once; the
shadow runs after it, in the ordinary fused steps, and is freed. Figures are
kept per (workflow, agent, repair policy) (`AuditBook`; `Engine.fidelity_report()`),
summed in `EngineStats` and traced (`Audited` events). Torch-free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from corps.engine.errors import InvalidRequest

#: Sampled positions an audit compares (the first ones: where a reused context matters
#: most, before the call's own tokens dominate what it attends to).
AUDIT_POSITIONS = 8
#: The largest N of audit=N (1 in N calls).
MAX_AUDIT = 1_000_000
#: The share of the tokens an engine encodes for its calls that its audits' shadows may
#: encode besides (`EngineConfig.audit_budget`; 1.0: no cap). A due audit waits for the
#: next call of its key the budget allows.
AUDIT_BUDGET = 0.05
#: Tokens of budget the audits may save up while none is due or affordable: what one
#: burst of shadows may encode beyond `AUDIT_BUDGET` of the work since (a larger
#: shadow waits until the bucket holds its own bound).
AUDIT_BURST = 256


def check_audit(value: object) -> int | None:
    """An audit rate: None (not set: the next level's) or an int >= 0 (0: off)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_AUDIT:
        raise InvalidRequest(f"audit must be an int in 0..{MAX_AUDIT} (1 in N calls; 0: off)")
    return value


@dataclass(frozen=True)
class AuditKey:
    """What audit figures are kept by: the workflow (its family: a pattern's runs share
    their pattern's name; "" outside any), the agent ("" for none; an agent named
    after its workflow, "<run>-<role>" as a pattern's are, by its role) and the
    repair policy the call ran with."""

    workflow: str
    agent: str
    repair: str


@dataclass(frozen=True)
class Audit:
    """One audited call: its call id, key, the positions compared, the mean KL per
    position (nats), the share of positions whose argmax agreed, and the tokens the
    shadow encoded (the audit's own cost)."""

    call_id: int
    key: AuditKey
    positions: int
    gap: float
    agreement: float
    tokens: int


@dataclass(frozen=True)
class AuditRow:
    """The audits of one key, summed: calls, positions, mean gap and agreement per
    position, and the tokens their shadows encoded."""

    key: AuditKey
    calls: int
    positions: int
    gap: float
    agreement: float
    tokens: int


class AuditBook:
    """Audit figures summed per key (bounded: one entry per workflow family, agent and
    policy seen)."""

    def __init__(self) -> None:
        self._sums: dict[AuditKey, list[float]] = {}  # calls, positions, kl, agree, tokens

    def add(self, a: Audit) -> None:
        s = self._sums.setdefault(a.key, [0, 0, 0.0, 0.0, 0])
        s[0] += 1
        s[1] += a.positions
        s[2] += a.gap * a.positions
        s[3] += a.agreement * a.positions
        s[4] += a.tokens

    def rows(self) -> list[AuditRow]:
        """One row per key, in the order keys were first seen."""
        return [_row(k, s) for k, s in self._sums.items()]

    def total(self) -> AuditRow:
        """Every audit together (key fields empty)."""
        sums = [sum(s[i] for s in self._sums.values()) for i in range(5)]
        return _row(AuditKey("", "", ""), sums)


def _row(key: AuditKey, s: list[float]) -> AuditRow:
    n = s[1]
    gap, agree = (s[2] / n, s[3] / n) if n else (math.nan, math.nan)
    return AuditRow(key, int(s[0]), int(n), gap, agree, int(s[4]))


@dataclass(frozen=True)
class AuditReport:
    """`Engine.fidelity_report()`: one row per key, every audit together (`total`), the
    shadows that could not run (`failed`: the engine closing, no room) and each
    key's policy under `repair="auto"` now (`auto`: (workflow, agent) -> policy)."""

    rows: tuple[AuditRow, ...]
    total: AuditRow
    failed: int
    auto: dict[tuple[str, str], str]
