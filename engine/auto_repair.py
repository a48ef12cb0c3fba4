"""`repair="auto"`: the repair policy chosen per workflow and agent from audited gaps.

A call whose repair is "auto" (`corps.engine.repair.AUTO`) runs with the policy
its (workflow family, agent) is at now on `LADDER`, cheapest first, and such calls
are audited (`corps.engine.audit`; 1 in `AUTO_AUDIT` unless an audit rate is
given). After each audit of a key, its smoothed gap (an exponential mean,
`SMOOTHING`, restarted at every switch) moves it on the ladder:

- **up** one rung as soon as the smoothed gap exceeds `HIGH`: a workflow whose
  answers drift from the baseline's is repaired at the next call, not after a
  window;
- **down** one rung once `patience` audits in a row stayed below `LOW`: a
  cheaper policy is tried only after the gap stayed well under the threshold;
- **back up** at once if the first audit on the lower rung exceeds `HIGH`,
  doubling `patience` (up to `MAX_PATIENCE`): a key whose lower rung is known to
  fail is not moved down again soon.

The band between `LOW` and `HIGH` and the patience are the hysteresis: one noisy
audit (eight positions) cannot move a key both ways, and a policy that only
holds the gap down because it repairs cannot oscillate off the ladder's top at
every other call. Each switch is a `Switch`, traced (`repair_switch` events).
Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# LADDER, cheapest first: nothing; EPIC's sink tokens; the query's most attended tenth,
# then third; every rewired token (defined beside the policies, `corps.engine.repair`,
# which checks an "auto:P" start against it). Costs and closed gaps: docs/fidelity.md.
from corps.engine.repair import LADDER, Repair

#: Smoothed gap (KL nats per token, corps.engine.audit) above which a key moves up.
HIGH = 0.04
#: Smoothed gap below which an audit counts toward moving down.
LOW = 0.01
#: Weight of the newest audit in the smoothed gap.
SMOOTHING = 0.5
#: Audits in a row below LOW before a key moves down (doubled by a failed move down).
PATIENCE = 3
MAX_PATIENCE = 48
#: An "auto" call is audited 1 in this many when no audit rate is given.
AUTO_AUDIT = 4


@dataclass(frozen=True)
class Switch:
    """A key moved from one policy to another after an audit: why ("high": the smoothed
    gap above HIGH; "low": `patience` audits below LOW; "fell back": the first audit
    after moving down was above HIGH)."""

    workflow: str
    agent: str
    before: str
    after: str
    gap: float
    why: str


@dataclass
class _State:
    rung: int = 0
    smoothed: float | None = None
    calm: int = 0  # audits in a row below LOW
    patience: int = PATIENCE
    probing: bool = False  # moved down, not audited since


@dataclass
class AutoRepair:
    """Each (workflow, agent)'s rung on `LADDER`, moved by `observe`."""

    ladder: tuple[Repair, ...] = LADDER
    _keys: dict[tuple[str, str], _State] = field(default_factory=dict)

    def policy(self, workflow: str, agent: str, start: Repair | None = None) -> Repair:
        """The policy a call of this key runs with now. A key not seen yet starts at
        rung `start` ("auto:P": a pattern's decision steps start where its default
        repairs them), else at the bottom."""
        state = self._keys.get((workflow, agent))
        if state is None and start in self.ladder[1:]:  # its first call: where it starts
            state = self._keys[(workflow, agent)] = _State(rung=self.ladder.index(start))
        return self.ladder[state.rung if state else 0]

    def observe(self, workflow: str, agent: str, gap: float) -> Switch | None:
        """An audit of this key measured `gap`: its rung moves if the rule says so."""
        s = self._keys.setdefault((workflow, agent), _State())
        probing, s.probing = s.probing, False
        s.smoothed = gap if s.smoothed is None else SMOOTHING * gap + (1 - SMOOTHING) * s.smoothed
        s.calm = s.calm + 1 if gap < LOW else 0
        top = len(self.ladder) - 1
        if s.smoothed > HIGH and s.rung < top:
            if probing:
                s.patience = min(2 * s.patience, MAX_PATIENCE)
            return self._move(workflow, agent, s, +1, "fell back" if probing else "high")
        if s.calm >= s.patience and s.rung > 0:
            switch = self._move(workflow, agent, s, -1, "low")
            s.probing = True
            return switch
        return None

    def chosen(self) -> dict[tuple[str, str], str]:
        """Each key seen and the policy it is at now."""
        return {k: str(self.ladder[s.rung]) for k, s in self._keys.items()}

    def _move(self, workflow: str, agent: str, s: _State, step: int, why: str) -> Switch:
        before, gap = self.ladder[s.rung], s.smoothed or 0.0
        s.rung += step
        s.smoothed, s.calm = None, 0
        return Switch(workflow, agent, str(before), str(self.ladder[s.rung]), gap, why)
