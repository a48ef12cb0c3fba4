"""`corps bench step`: the host's share of a decode step, the time outside the forward.

For each number of streams (1, 16, 64 by default) it prefills one short prompt per
stream, then decodes them together, `tokens` tokens each, through the batching
loop, and reports per step: the step's wall time, the model's forward inside it,
and the rest, which is the host's (plan, batch, sample, postprocess, job
completion, the hop to the torch thread and back). On a tiny model (`dummy:tiny`,
the default) the forward is small, so the host's part is what the figure shows.

`rounds` > 1 runs the counts round-robin and reports each one's median, so a
machine whose speed drifts hits every count alike. Only public engine API is used:
the figures come from `Engine.stats()` (`step_s`, `forward_s`, `steps`), taken
around the decode only: `tokens` + 1 steps, the first of which also encodes each
stream's role header and the last each stream's closing footer; the others decode
one token per stream. Run it against any tree with `python -m corps.cli.bench.step`.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

#: the streams measured by default
STREAMS = (1, 16, 64)


@dataclass(frozen=True)
class StepFigures:
    streams: int
    steps: int
    step_ms: float  # wall time per step
    forward_ms: float  # the model's forward per step
    host_ms: float  # the rest: planning, batching, sampling, bookkeeping

    @property
    def host_share(self) -> float:
        return self.host_ms / self.step_ms if self.step_ms else 0.0


async def one(engine, streams: int, tokens: int) -> StepFigures:
    """Decode `streams` streams of `tokens` tokens together; the per-step figures."""
    qs = await engine.prefill_many([dict(message=f"Count to ten (#{i}).") for i in range(streams)])
    before = engine.stats()
    calls = [dict(parents=[q], max_tokens=tokens, ignore_eos=True) for q in qs]
    handles = await engine.decode_many(calls)
    after = engine.stats()
    for h in [*handles, *qs]:
        engine.free(h)
    steps = after.steps - before.steps
    step_s = after.step_s - before.step_s
    forward_s = after.forward_s - before.forward_s
    per = 1e3 / max(steps, 1)
    return StepFigures(streams, steps, step_s * per, forward_s * per, (step_s - forward_s) * per)


async def measure(
    model: str, *, streams=STREAMS, tokens: int = 64, rounds: int = 3, **engine_kw
) -> list[StepFigures]:
    """Median figures per stream count over `rounds` round-robin rounds."""
    from corps.engine import Engine

    runs: dict[int, list[StepFigures]] = {n: [] for n in streams}
    async with Engine.open(model, **engine_kw) as engine:
        await one(engine, 1, 4)  # warm-up: first-call costs are not a step's
        for _ in range(rounds):
            for n in streams:
                runs[n].append(await one(engine, n, tokens))
    return [_median(rs) for rs in runs.values()]


def _median(rs: list[StepFigures]) -> StepFigures:
    mid = statistics.median_low([r.host_ms for r in rs])
    return next(r for r in rs if r.host_ms == mid)


def table(figures: list[StepFigures], title: str) -> Table:
    t = Table(title=title)
    for col in ("streams", "steps", "step ms", "forward ms", "host ms", "host share"):
        t.add_column(col, justify="right")
    for f in figures:
        t.add_row(
            str(f.streams),
            str(f.steps),
            f"{f.step_ms:.2f}",
            f"{f.forward_ms:.2f}",
            f"{f.host_ms:.2f}",
            f"{f.host_share:.0%}",
        )
    return t


def main(model: str, tokens: int, rounds: int, streams=STREAMS, **engine_kw) -> list[StepFigures]:
    import anyio

    figures = anyio.run(
        lambda: measure(model, streams=streams, tokens=tokens, rounds=rounds, **engine_kw)
    )
    Console().print(table(figures, f"host share of a decode step ({model})"))
    return figures


if __name__ == "__main__":  # run against any tree: python -m corps.cli.bench.step
    import sys

    main(sys.argv[1] if len(sys.argv) > 1 else "dummy:tiny", 64, 5, dtype="float32")
