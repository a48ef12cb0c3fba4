"""`corps bench batching`: aggregate decode throughput through the batching loop.

For each number of concurrent streams it prints, in one run on one model and
dtype: tokens/s of the streams run concurrently through the loop, the same kind
of streams served one at a time (measured on up to 4 of them: the per-stream
rate does not depend on how many), HF `generate` with batch size 1, the
speed-up over one stream, and the share of wall time spent outside the model's
forward (the scheduler's overhead: batching, sampling, bookkeeping, thread hops).
"""

from __future__ import annotations

import time

import anyio
import torch
from rich.console import Console
from rich.table import Table

from corps.cli.bench_runner import measure_hf

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
    core = engine._core
    forward0, t0 = core.forward_seconds, time.perf_counter()
    kw = dict(max_tokens=tokens, ignore_eos=True)
    if concurrent:
        handles = await engine.decode_many([dict(parents=[q], **kw) for q in qs])
    else:
        handles = [await engine.decode(parents=[q], **kw) for q in qs]
    wall = time.perf_counter() - t0
    forward = core.forward_seconds - forward0
    for h in [*handles, *qs]:
        engine.free(h)
    return n * tokens / wall, 1 - forward / wall


async def _measure(model: str, dtype: str, counts: list[int], tokens: int):
    from corps.engine.engine import Engine

    rows = []
    async with Engine.open(model, dtype=dtype) as engine:
        await _streams(engine, 2, 4, True)  # warm up
        for n in counts:
            together, overhead = await _streams(engine, n, tokens, True)
            alone, _ = await _streams(engine, min(n, 4), tokens, False)
            rows.append((n, together, alone, overhead))
        path = engine.model_path
    return rows, path


def main(model: str, dtype: str, counts: list[int], tokens: int) -> None:
    from corps.engine.engine import DTYPES

    rows, path = anyio.run(_measure, model, dtype, counts, tokens)
    hf, _ = measure_hf(path, DTYPES[dtype], tokens, 8, 1)
    base = rows[0][1]
    table = Table(
        title=f"batching loop ({model}, {dtype}, {tokens} tokens per stream, "
        f"CPU threads={torch.get_num_threads()})"
    )
    for col in (
        "streams",
        "loop tok/s",
        "one at a time",
        "HF generate bs=1",
        "vs 1 stream",
        "overhead",
    ):
        table.add_column(col, justify="right")
    for n, together, alone, overhead in rows:
        table.add_row(
            str(n),
            f"{together:.1f}",
            f"{alone:.1f}",
            f"{hf:.1f}",
            f"{together / base:.2f}x",
            f"{overhead:.1%}",
        )
    Console().print(table)
