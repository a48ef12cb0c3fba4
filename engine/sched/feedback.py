"""Feedback on the steps that run beside latency-critical calls.

The `objective` policy bounds a step beside critical calls by a prediction
(`corps.engine.sched.cost`): `step_slowdown` times the latency calls' step
alone. That prediction is a line fitted over every step the engine ran, most of
them large ones under load, and it misjudges the small step of a chat alone:
on the default model (2-core host) it put a lone chat's step at 39 ms where the
chat alone took 26-36 ms, so the bound let in steps of 52-55 ms and the chats'
time per token came out 1.5-1.6x what it is on an idle engine. A step's wall
time also holds admitting new calls and the hops to the torch thread and back,
which the fit (on the forward alone) leaves out.

So the loop reports each step's wall time, and this controller steers by what
the critical calls actually wait:

- a step that ran the latency calls alone measures their step alone; the
  median of the last `WINDOW` such walls is the reference (`alone`). The policy
  runs such a step (a probe: throughput calls sit it out) while fewer than
  `MIN_ALONE` were measured, and again every `PROBE_EVERY` steps, so the
  reference follows the calls (a growing view) and the machine (a host whose
  speed drifts);
- each step beside critical calls compares its wall with the reference, and
  moves the `share` of the bound's headroom (the time above the latency calls'
  predicted step alone) that throughput calls may use by `gain` times the
  error against `target`, clipped so that one stalled step does not empty it:
  an integral controller, so in steady state those steps average `target`
  times the critical calls' step alone.

The share starts at 0 and, once no critical call runs, goes back to 0 with the
reference forgotten (`reset`): the next critical calls first run alone and
measure their own step (their views and the machine's speed then), and the
share opens from there as far as the walls allow.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

#: The steps beside critical calls average this factor of those calls' step alone,
#: well below the 1.5x of an idle engine a user would accept: the step alone under
#: load is itself above an idle engine's, and the chats' averages spread (at 1.3 the
#: chats' p99 came out 1.54x idle on the default model, docs/benchmarks.md).
TARGET = 1.2
#: Share moved per step per unit of error (target - wall / alone).
GAIN = 0.2
#: A step's error is clipped to this magnitude: one stalled step moves the share
#: by at most GAIN x ERROR_CLIP.
ERROR_CLIP = 0.5
#: Walls of the latency calls' steps alone kept for the reference.
WINDOW = 16
#: Steps alone measured before the share may open.
MIN_ALONE = 3
#: Steps beside critical calls between two probes (a step of the latency calls alone).
PROBE_EVERY = 32


@dataclass
class StepFeedback:
    """How much of the step bound's headroom throughput calls may use (`share`, 0 to
    1), steered by the measured wall times of the steps beside critical calls."""

    target: float = TARGET
    gain: float = GAIN
    probe_every: int = PROBE_EVERY
    share: float = 0.0
    _walls: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    _since: int = 0  # steps since the last one measured alone

    def reset(self) -> None:
        """No critical call runs: forget the reference and close the share."""
        self.share, self._since = 0.0, 0
        self._walls.clear()

    def probe(self) -> bool:
        """Whether the next step should run the latency calls alone, to measure it."""
        return len(self._walls) < MIN_ALONE or self._since >= self.probe_every

    def alone(self) -> float | None:
        """Seconds the latency calls' step alone takes (the median measured); None
        before `MIN_ALONE` were measured."""
        return statistics.median(self._walls) if len(self._walls) >= MIN_ALONE else None

    def observe(self, wall: float, alone: bool) -> None:
        """A step with critical calls took `wall` seconds, running the latency calls
        `alone` or beside others: a step alone is measured, and every step moves the
        share toward keeping such steps at `target` times the step alone."""
        if not wall > 0:
            return
        if alone:
            self._walls.append(wall)
            self._since = 0
        else:
            self._since += 1
        reference = self.alone()
        if reference is not None:
            error = max(-ERROR_CLIP, min(ERROR_CLIP, self.target - wall / reference))
            self.share = min(1.0, max(0.0, self.share + self.gain * error))
