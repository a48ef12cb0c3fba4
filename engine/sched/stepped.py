"""What the loop keeps of its steps: one step's record as the torch thread ran it
(`Stepped`), the trace's event of it, and the loop's running counters (`Counters`,
`Engine.stats()`'s scheduler figures)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from corps.engine.exec.call import Call
from corps.engine.exec.step_plan import StepOutput
from corps.engine.trace.events import Step


@dataclass
class Stepped:
    """One step as the torch thread ran it, for the loop's bookkeeping
    (`Scheduler._account`)."""

    t0: float  # when it began (the first of a run ahead: when the loop handed it over)
    end: float  # when it ended (the last of a run ahead: when the loop took it back)
    out: StepOutput
    tokens: list[tuple[Call, int]]  # sampled, with their calls
    ran: bool  # a forward step ran (the policy's feedback, the trace's step event)
    admit_s: float  # seconds before its forward (admission)
    calls: int  # calls running or ended at its end
    queue: int  # calls queued or held at its end
    gauges: tuple[int, ...]  # the executor's gauges at its end (the trace's step event)
    fed_back: bool = False  # the policy had its wall time on the torch thread (run ahead)


def step_event(s: Stepped, t: float, preempted: tuple[int, ...]) -> tuple[Step, tuple[int, ...]]:
    """The trace's event of step `s` (at trace time `t`), and the executor's (evicted,
    recomputed) counts now: the event says how many each grew since `preempted`."""
    used, capacity, *now = s.gauges
    evicted, recomputed = (b - a for a, b in zip(preempted, now, strict=True))
    event = Step(
        t=t, dur=s.end - s.t0, calls=s.calls, sampled=len(s.tokens), store_used=used,
        capacity=capacity, queue=s.queue, rows=s.out.rows, stepped=s.out.calls,
        admit_s=s.admit_s, evicted=evicted, recomputed=recomputed, chunks=s.out.chunks,
        keys=s.out.keys,
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
