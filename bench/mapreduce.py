"""`corps bench mapreduce`: one latency-sensitive map-reduce summary of a long
document, its map stage scheduled as a task group or every call under a latency
cap (Parrot's figure 14 setting), side by side in one run.

Three engines on the same model, each running the `map_reduce` pattern inside a
workflow whose objective is "latency" (someone waits for the summary):

- `fcfs`: first come, first served, no objectives (no cap, no priority);
- `latency caps`: the `objective` policy with every call critical
  (`deduce_objectives=False`) and its fixed caps (`pin_caps`: no learnt step
  cost, no rows from measured kernels): each bounds the step beside it to 64
  prompt tokens, as a serving system that takes each request as
  latency-sensitive in isolation does;
- `task group`: the `objective` policy with objectives deduced: the chunks'
  prefills and the map decodes are task groups (latency, not critical), so their
  steps run full; the calls made alone (each reduce) are critical.

Each round runs every engine once, in an order that alternates, after one
warm-up run each; wall time is the median over rounds. Tokens encoded and
decoded are reported so that equal work can be checked.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

from rich.console import Console
from rich.table import Table

CONFIGS: dict[str, dict] = {
    "fcfs": dict(policy="fcfs"),
    "latency caps": dict(policy="objective", deduce_objectives=False),
    "task group": dict(policy="objective", deduce_objectives=True),
}


@dataclass
class Row:
    config: str
    walls: list[float] = field(default_factory=list)
    encoded: int = 0  # tokens encoded over the timed runs
    decoded: int = 0  # tokens sampled over the timed runs
    steps: int = 0

    @property
    def median(self) -> float:
        return statistics.median(self.walls)


def pin_caps(policy) -> None:
    """The `latency caps` configuration's bounds: every step beside a critical call
    encodes at most `latency_prefill` (64) prompt tokens. Neither the learnt step
    cost nor the rows from the measured kernels: on a CPU whose products were
    measured (dtype auto, or float32 where AMX ran them), those allow as few as two
    rows a step, a cap no per-call latency target asks for."""
    policy.cost = None
    policy.latency_rows = None


async def one_run(engine, rt, params: dict) -> float:
    """Seconds of one map-reduce run with a latency objective."""
    from corps.patterns.registry import run_pattern

    t0 = time.perf_counter()
    with engine.workflow("map-reduce", objective="latency"):
        await run_pattern(rt, "map_reduce", params)
    return time.perf_counter() - t0


async def measure(model: str, dtype: str, params: dict, rounds: int) -> list[Row]:
    """Each configuration's rows: `rounds` timed runs each, alternated."""
    from contextlib import AsyncExitStack

    from corps.agents import Runtime
    from corps.engine import Engine

    rows = {name: Row(name) for name in CONFIGS}
    async with AsyncExitStack() as stack:
        runtimes = {}
        for name, settings in CONFIGS.items():
            engine = await stack.enter_async_context(Engine.open(model, dtype=dtype, **settings))
            if name == "latency caps":  # fixed per-call caps: 64 prompt tokens a step
                pin_caps(engine.policy)
            runtimes[name] = (engine, await stack.enter_async_context(Runtime(engine)))
            await one_run(engine, runtimes[name][1], params)  # warm-up
        names = list(CONFIGS)
        for r in range(rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                engine, rt = runtimes[name]
                before = engine.stats()
                rows[name].walls.append(await one_run(engine, rt, params))
                after = engine.stats()
                rows[name].encoded += after.tokens_encoded - before.tokens_encoded
                rows[name].decoded += after.tokens_sampled - before.tokens_sampled
                rows[name].steps += after.steps - before.steps
    return list(rows.values())


def table(rows: list[Row], title: str) -> Table:
    caps = next(r for r in rows if r.config == "latency caps")
    out = Table(title=title)
    for col in ("configuration", "wall per round (s)", "median (s)", "vs latency caps",
                "tokens encoded", "tokens decoded", "steps"):  # fmt: skip
        out.add_column(col, justify="right")
    for r in rows:
        out.add_row(
            r.config,
            ", ".join(f"{w:.2f}" for w in r.walls),
            f"{r.median:.2f}",
            f"{caps.median / r.median:.2f}x faster",
            str(r.encoded),
            str(r.decoded),
            str(r.steps),
        )
    return out


def main(model: str, dtype: str, repeat: int, chunk_tokens: int, max_tokens: int,
         rounds: int) -> list[Row]:  # fmt: skip
    import anyio

    from corps.patterns.samples import DOCUMENT

    document = "\n\n".join([DOCUMENT] * repeat)
    params = dict(document=document, chunk_tokens=chunk_tokens, max_tokens=max_tokens, seed=0)
    rows = anyio.run(measure, model, dtype, params, rounds)
    title = (
        f"map-reduce, latency objective ({model}, {dtype}, document x{repeat}, "
        f"chunks of {chunk_tokens} tokens, {rounds} rounds)"
    )
    Console().print(table(rows, title))
    return rows
