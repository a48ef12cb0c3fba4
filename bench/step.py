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
one token per stream. `wall_ms` is the decode's wall time as its caller saw it,
per step: the steps' time plus the loop's own between them.

`run_ahead` values (`EngineConfig.run_ahead`) each get an engine, measured in the
same rounds: 1 hands every step back to the event loop, the default runs steps
back to back while nothing needs the loop between them.
Run it against any tree with `python -m corps.bench.step`.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

#: the streams measured by default
STREAMS = (1, 16, 64)
#: the `run_ahead` settings compared by default: a hop per step, and the default
RUN_AHEADS = (1, 8)


@dataclass(frozen=True)
class StepFigures:
    streams: int
    steps: int
    step_ms: float  # wall time per step
    forward_ms: float  # the model's forward per step
    host_ms: float  # the rest: planning, batching, sampling, bookkeeping
    wall_ms: float = 0.0  # the decode's wall time as its caller saw it, per step
    run_ahead: int = 0  # the engine's setting (0: its default)

    @property
    def host_share(self) -> float:
        return self.host_ms / self.step_ms if self.step_ms else 0.0


async def one(engine, streams: int, tokens: int, top_logprobs: int | None = None) -> StepFigures:
    """Decode `streams` streams of `tokens` tokens together; the per-step figures. With
    `top_logprobs` (0 or more), every call keeps its tokens' log-probabilities too."""
    qs = await engine.prefill_many([dict(message=f"Count to ten (#{i}).") for i in range(streams)])
    before = engine.stats()
    scored = {} if top_logprobs is None else dict(logprobs=True, top_logprobs=top_logprobs)
    calls = [dict(parents=[q], max_tokens=tokens, ignore_eos=True, **scored) for q in qs]
    t0 = time.perf_counter()
    handles = await engine.decode_many(calls)
    wall = time.perf_counter() - t0
    after = engine.stats()
    for h in [*handles, *qs]:
        engine.free(h)
    steps = after.steps - before.steps
    step_s = after.step_s - before.step_s
    forward_s = after.forward_s - before.forward_s
    per = 1e3 / max(steps, 1)
    host = (step_s - forward_s) * per
    return StepFigures(streams, steps, step_s * per, forward_s * per, host, wall * per)


async def measure(
    model: str,
    *,
    streams=STREAMS,
    tokens: int = 64,
    rounds: int = 3,
    run_aheads=(None,),
    top_logprobs: int | None = None,
    **engine_kw,
) -> list[StepFigures]:
    """Median figures per (run_ahead, stream count) over `rounds` round-robin rounds,
    one engine per `run_aheads` value (None: the engine's default), all open at once."""
    from contextlib import AsyncExitStack

    from corps.engine import Engine

    runs: dict[tuple, list[StepFigures]] = {(a, n): [] for a in run_aheads for n in streams}
    async with AsyncExitStack() as stack:
        engines = {}
        for a in run_aheads:
            kw = engine_kw if a is None else engine_kw | dict(run_ahead=a)
            engines[a] = await stack.enter_async_context(Engine.open(model, **kw))
            await one(engines[a], 1, 4)  # warm-up: first-call costs are not a step's
        for _ in range(rounds):
            for (a, n), rs in runs.items():
                f = await one(engines[a], n, tokens, top_logprobs)
                rs.append(dataclasses.replace(f, run_ahead=a or 0))
    return [_median(rs) for rs in runs.values()]


def _median(rs: list[StepFigures]) -> StepFigures:
    mid = statistics.median_low([r.host_ms for r in rs])
    return next(r for r in rs if r.host_ms == mid)


def table(figures: list[StepFigures], title: str) -> Table:
    t = Table(title=title)
    cols = ("run ahead", "streams", "steps", "step ms", "forward ms", "host ms", "host share")
    for col in (*cols, "wall ms", "host vs 1"):
        t.add_column(col, justify="right")
    alone = {f.streams: f.host_ms for f in figures if f.run_ahead == 1}
    for f in figures:
        ratio = f"{f.host_ms / alone[f.streams]:.2f}x" if alone.get(f.streams) else ""
        t.add_row(
            str(f.run_ahead or "default"),
            str(f.streams),
            str(f.steps),
            f"{f.step_ms:.2f}",
            f"{f.forward_ms:.2f}",
            f"{f.host_ms:.2f}",
            f"{f.host_share:.0%}",
            f"{f.wall_ms:.2f}",
            ratio,
        )
    return t


def main(
    model: str,
    tokens: int,
    rounds: int,
    streams=STREAMS,
    run_aheads=RUN_AHEADS,
    top_logprobs: int | None = None,
    **engine_kw,
) -> list[StepFigures]:
    import anyio

    figures = anyio.run(
        lambda: measure(
            model,
            streams=streams,
            tokens=tokens,
            rounds=rounds,
            run_aheads=run_aheads,
            top_logprobs=top_logprobs,
            **engine_kw,
        )
    )
    Console().print(table(figures, f"host share of a decode step ({model})"))
    Console().print(
        "[dim]run ahead: steps the torch thread may run without a hop to the event loop "
        "(1: a hop each); host: the step's time outside the forward; wall: the decode's "
        "time per step as its caller saw it; host vs 1: against run ahead 1[/]"
    )
    return figures


if __name__ == "__main__":  # run against any tree: python -m corps.bench.step
    import sys

    main(sys.argv[1] if len(sys.argv) > 1 else "dummy:tiny", 64, 5, dtype="float32")
