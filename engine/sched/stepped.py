"""What the loop keeps of its steps: the trace's event of one (from its record, a
`StepOutput`), and the loop's running counters (`Counters`, `Engine.stats()`'s
scheduler figures)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from corps.engine.exec.step_plan import StepOutput
from corps.engine.trace.events import Step


def step_event(s: StepOutput, t: float, preempted: tuple[int, ...]) -> tuple[Step, tuple[int, ...]]:
    """The trace's event of step `s` (at trace time `t`), and the executor's (evicted,
    recomputed) counts now: the event says how many each grew since `preempted`."""
    used, capacity, *now = s.gauges
    evicted, recomputed = (b - a for a, b in zip(preempted, now, strict=True))
    event = Step(
        t=t, dur=s.end - s.t0, calls=s.running, sampled=len(s.tokens), store_used=used,
        capacity=capacity, queue=s.queue, rows=s.rows, stepped=s.calls,
        admit_s=s.admit_s, evicted=evicted, recomputed=recomputed, chunks=s.chunks,
        keys=s.keys,
    )  # fmt: skip
    return event, tuple(now)


@dataclass
class Counters:
    """The loop's running totals, since the engine opened."""

    steps: int = 0
    calls_in_steps: int = 0
    tokens_sampled: int = 0
    step_seconds: float = 0.0  # wall time of steps, measured on the loop
    forward_seconds: float = 0.0  # of which in the model's forward
    encode_seconds: float = 0.0  # of which in steps that encoded a prompt chunk or a footer
    ttft_sum: float = 0.0
    ttft_n: int = 0

    def figures(self, queue_depth: int, running: int) -> dict[str, float]:
        """The scheduler's figures of `Engine.stats()`, with the queue and running now."""
        return dict(
            steps=self.steps,
            mean_batch_size=self.calls_in_steps / self.steps if self.steps else 0.0,
            queue_depth=queue_depth,
            running=running,
            tokens_per_s=self.tokens_sampled / self.step_seconds if self.step_seconds else 0.0,
            tokens_sampled=self.tokens_sampled,
            mean_ttft_s=self.ttft_sum / self.ttft_n if self.ttft_n else math.nan,
            overhead=1 - self.forward_seconds / self.step_seconds if self.step_seconds else 0.0,
            step_s=self.step_seconds,
            encode_step_s=self.encode_seconds,
        )
