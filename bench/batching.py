"""`corps bench batching`: aggregate decode throughput through the batching loop.

For each number of concurrent streams it prints, in one run on one model and
dtype: tokens/s of the streams run concurrently through the loop, the same kind
of streams served one at a time (measured on up to 4 of them: the per-stream
rate does not depend on how many), HF `generate` with batch size 1, the
speed-up over one stream, and the share of wall time spent outside the model's
forward (the scheduler's overhead: batching, sampling, bookkeeping, thread hops).

With `rounds` > 1 the stream counts run round-robin (1, 4, 16, 1, 4, 16, ...), so
a machine whose speed drifts hits every count alike: each count reports its
median, and the speed-up over one stream gives the range of the per-round ratios
(each taken between measurements seconds apart).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import torch
from rich.console import Console
from rich.table import Table

from corps.bench.runner import measure_hf

TOPICS = [
    "a lighthouse",
    "a dragon",
    "the sea",
    "a city at night",
    "a robot",
    "a garden",
    "the moon",
    "a train",
]


async def _streams(engine, n: int, tokens: int, concurrent: bool) -> tuple[float, float]:
    """(tokens/s, overhead share) for n decode streams."""
    prompts = [f"Write a story about {TOPICS[i % len(TOPICS)]} (#{i})." for i in range(n)]
    qs = await engine.prefill_many([dict(message=p) for p in prompts])
    forward0, t0 = engine.stats().forward_s, time.perf_counter()
    kw = dict(max_tokens=tokens, ignore_eos=True)
    if concurrent:
        handles = await engine.decode_many([dict(parents=[q], **kw) for q in qs])
    else:
        handles = [await engine.decode(parents=[q], **kw) for q in qs]
    wall = time.perf_counter() - t0
    forward = engine.stats().forward_s - forward0
    for h in [*handles, *qs]:
        engine.free(h)
    return n * tokens / wall, 1 - forward / wall


@dataclass
class Row:
    streams: int
    together: list[float] = field(default_factory=list)  # tok/s, one per round
    overhead: list[float] = field(default_factory=list)
    alone: float = 0.0  # tok/s served one at a time (first round)

    def ratios(self, base: Row) -> list[float]:
        """Per round: this count's tok/s over the first count's in the same round."""
        return [t / b for t, b in zip(self.together, base.together, strict=True)]


async def _measure(
    model: str, dtype: str, counts: list[int], tokens: int, rounds: int = 1, weights: str = "auto"
) -> tuple[list[Row], Any]:
    from corps.engine import Engine

    rows = [Row(n) for n in counts]
    async with Engine.open(model, dtype=dtype, weights=weights) as engine:
        await _streams(engine, 2, 4, True)  # warm up
        for r in range(rounds):
            for row in rows:
                together, overhead = await _streams(engine, row.streams, tokens, True)
                row.together.append(together)
                row.overhead.append(overhead)
                if r == 0:
                    row.alone, _ = await _streams(engine, min(row.streams, 4), tokens, False)
        path = engine.model_path
    return rows, path


def main(
    model: str,
    dtype: str,
    counts: list[int],
    tokens: int,
    rounds: int = 1,
    weights: str = "auto",
) -> None:
    from corps.engine.model.weights import torch_dtype

    rows, path = anyio.run(_measure, model, dtype, counts, tokens, rounds, weights)
    hf, _ = measure_hf(path, torch_dtype(dtype), tokens, 8, 1)
    base = rows[0]
    table = Table(
        title=f"batching loop ({model}, {dtype}, weights {weights}, {tokens} tokens per stream, "
        f"CPU threads={torch.get_num_threads()}, median of {rounds} round(s))"
    )
    for col in (
        "streams",
        "loop tok/s",
        "one at a time",
        "HF generate bs=1",
        f"vs {base.streams} stream{'s' if base.streams > 1 else ''}",
        "overhead",
    ):
        table.add_column(col, justify="right")
    for row in rows:
        ratios = row.ratios(base)
        spread = f" [{min(ratios):.2f}, {max(ratios):.2f}]" if rounds > 1 else ""
        table.add_row(
            str(row.streams),
            f"{statistics.median(row.together):.1f}",
            f"{row.alone:.1f}",
            f"{hf:.1f}",
            f"{statistics.median(ratios):.2f}x{spread}",
            f"{statistics.median(row.overhead):.1%}",
        )
    Console().print(table)
