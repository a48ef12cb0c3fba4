"""`corps bench cluster`: what running through Ray workers costs and buys, side by side.

One run, one local Ray instance, the same inputs (multi-QA pairs, seeded) in
every configuration, alternated over `rounds`:

- `embedded`: one engine in this process (`corps run --inputs` without workers);
- `ray 1x{T}`: one worker through Ray with the same threads (the overhead target:
  its throughput over the embedded engine's, per round);
- `ray {N}x1`: N workers of one thread each, the same workflows in flight in all
  (the cost or gain of splitting this machine's cores).

It also reports the driver's CPU per workflow and, from it, how many workers of
this workflow rate one driver can feed; and prefix co-location: inputs over a few
long shared documents, on 2 workers in baseline mode (whose radix cache reuses a
prefix already encoded), routed with and without co-location (tokens encoded).
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

from pydantic import BaseModel
from rich.table import Table

from corps.engine.config import EngineConfig
from corps.patterns.cluster.ray_setup import start_local_ray
from corps.patterns.cluster.runner import Cluster
from corps.patterns.evaluation.inputs import question_pairs


class Cell(BaseModel):
    config: str
    round: int
    workflows: int
    wall_s: float  # first dispatch to last result (start-up excluded)
    start_s: float  # engine / workers up
    failed: int = 0
    tokens_encoded: int = 0
    driver_ms: float | None = None  # driver CPU per workflow (Ray only)


class Report(BaseModel):
    cpu: str
    model: str
    dtype: str
    workflows: int
    max_tokens: int
    concurrency: int
    workers: int
    cells: list[Cell]
    colocation: list[Cell] = []

    def rate(self, config: str) -> float:
        """Median workflows per second of a configuration over the rounds."""
        cells = [c for c in self.cells if c.config == config]
        return statistics.median(c.workflows / c.wall_s for c in cells)

    def ratios(self, config: str, base: str = "embedded") -> list[float]:
        """Per round, `config`'s throughput over `base`'s."""
        rounds = sorted({c.round for c in self.cells})
        by = {(c.config, c.round): c.workflows / c.wall_s for c in self.cells}
        return [by[config, r] / by[base, r] for r in rounds if (config, r) in by]


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def _inputs(n: int, max_tokens: int, seed: int) -> list[dict[str, Any]]:
    lines = question_pairs(n, seed)
    return [dict(questions=x["questions"], max_tokens=max_tokens, seed=seed + i,
                 constrained=False) for i, x in enumerate(lines)]  # fmt: skip


async def _embedded(config: EngineConfig, inputs, concurrency: int, rnd: int) -> Cell:
    from corps.agents import Runtime
    from corps.engine import Engine
    from corps.patterns import multi_qa
    from corps.patterns.cluster.each import each

    t0 = time.perf_counter()
    async with Engine.open(config) as engine, Runtime(engine) as rt:
        start = time.perf_counter() - t0
        encoded = []

        async def one(i: int) -> None:
            encoded.append((await multi_qa(rt, **inputs[i])).tokens_encoded)

        t1 = time.perf_counter()
        failed = await each(range(len(inputs)), one, concurrency=concurrency)
        wall = time.perf_counter() - t1
    return Cell(config="embedded", round=rnd, workflows=len(inputs), wall_s=wall,
                start_s=start, failed=len(failed), tokens_encoded=sum(encoded))  # fmt: skip


async def _on_ray(
    label: str, config: EngineConfig, inputs, workers: int, threads: int, concurrency: int,
    rnd: int, co_locate: int = 256,
) -> Cell:  # fmt: skip
    t0 = time.perf_counter()
    async with Cluster(config, workers, threads_per_worker=threads, concurrency=concurrency,
                       co_locate=co_locate) as cluster:  # fmt: skip
        start = time.perf_counter() - t0
        t1 = time.perf_counter()
        outcomes = [o async for o in cluster.run("multi_qa", inputs)]
        wall = time.perf_counter() - t1
        stats = cluster.stats
    ok = [o.result for o in outcomes if o.ok]
    return Cell(config=label, round=rnd, workflows=len(inputs), wall_s=wall, start_s=start,
                failed=len(outcomes) - len(ok), driver_ms=stats.dispatch_ms,
                tokens_encoded=sum(r["tokens_encoded"] for r in ok))  # fmt: skip


def _documents(n: int, docs: int, max_tokens: int) -> list[dict[str, Any]]:
    """Inputs over `docs` long shared texts, interleaved (doc 0, 1, ..., 0, 1, ...)."""
    words = ("colour", "size", "label", "owner") * 10
    texts = [" ".join(f"Fact {d}.{k}: the {w} of box {d} is item number {k * 7 + d}."
                      for k, w in enumerate(words)) for d in range(docs)]  # fmt: skip
    return [dict(questions=[texts[i % docs], f"Question {i}: what is fact {i % docs}.{i % 40}?"],
                 max_tokens=max_tokens, seed=i, constrained=False)
            for i in range(n)]  # fmt: skip


async def measure(
    model: str, *, dtype: str, n: int, max_tokens: int, concurrency: int, workers: int,
    rounds: int, seed: int, colocation: bool = True,
) -> Report:  # fmt: skip
    """Every configuration on the same inputs, `rounds` times, alternated."""
    import ray

    cores = os.cpu_count() or 1
    config = EngineConfig.of(model, dtype=dtype)
    inputs = _inputs(n, max_tokens, seed)
    split = max(1, concurrency // workers)  # the same workflows in flight in every config
    report = Report(cpu=cpu_name(), model=model, dtype=dtype, workflows=n, max_tokens=max_tokens,
                    concurrency=concurrency, workers=workers, cells=[])  # fmt: skip
    start_local_ray(max(cores, workers))
    try:
        for r in range(rounds):
            report.cells.append(await _embedded(config, inputs, concurrency, r))
            report.cells.append(
                await _on_ray(f"ray 1x{cores}", config, inputs, 1, cores, concurrency, r)
            )
            report.cells.append(
                await _on_ray(f"ray {workers}x1", config, inputs, workers, 1, split, r)
            )
        if colocation:
            base = config.model_copy(update=dict(mode="baseline"))
            docs = _documents(n, workers + 1, max_tokens)  # not one per worker: that would
            # let least-loaded routing alone keep each document on one worker
            for label, co in (("co-located", 256), ("least loaded only", 0)):
                report.colocation.append(
                    await _on_ray(label, base, docs, workers, 1, split, 0, co_locate=co)
                )
    finally:
        ray.shutdown()
    return report


def tables(report: Report) -> list[Table]:
    head = (f"{report.workflows} multi-QA workflows x {report.max_tokens} tokens, "
            f"{report.concurrency} in flight, {report.model} ({report.dtype}), "
            f"{report.cpu}")  # fmt: skip
    t = Table(title=head)
    for col in ("config", "round", "start s", "wall s", "workflows/min", "failed",
                "driver CPU ms / workflow"):  # fmt: skip
        t.add_column(col, justify="right")
    for c in report.cells:
        t.add_row(c.config, str(c.round), f"{c.start_s:.1f}", f"{c.wall_s:.1f}",
                  f"{60 * c.workflows / c.wall_s:.1f}", str(c.failed),
                  "-" if c.driver_ms is None else f"{c.driver_ms:.2f}")  # fmt: skip
    out = [t]
    configs = list(dict.fromkeys(c.config for c in report.cells))
    r = Table(title="ratios (per round, then median): throughput over embedded")
    for col in ("config", "per round", "median", "target"):
        r.add_column(col, justify="right")
    for cfg in configs[1:]:
        ratios = report.ratios(cfg)
        target = ">= 0.9" if cfg.startswith("ray 1x") else "(no target)"
        r.add_row(cfg, ", ".join(f"{x:.2f}" for x in ratios),
                  f"{statistics.median(ratios):.2f}", target)  # fmt: skip
    out.append(r)
    ms = [c.driver_ms for c in report.cells if c.driver_ms is not None]
    one = next(cfg for cfg in configs if cfg.startswith("ray 1x"))
    per_worker = report.rate(one)  # workflows / s one worker sustains
    d = Table(title="driver: what one driver process can feed")
    for col in ("driver CPU ms / workflow (median)", "one worker's workflows/s",
                "workers one driver can feed"):  # fmt: skip
        d.add_column(col, justify="right")
    med = statistics.median(ms)
    d.add_row(f"{med:.2f}", f"{per_worker:.2f}", f"{1000 / med / per_worker:.0f}")
    out.append(d)
    if report.colocation:
        c = Table(title=f"prefix co-location: {report.workflows} inputs over "
                        f"{report.workers + 1} shared documents on {report.workers} workers, "
                        "baseline mode (radix cache), interleaved")  # fmt: skip
        for col in ("routing", "tokens encoded", "wall s", "failed"):
            c.add_column(col, justify="right")
        for cell in report.colocation:
            c.add_row(cell.config, str(cell.tokens_encoded), f"{cell.wall_s:.1f}",
                      str(cell.failed))  # fmt: skip
        out.append(c)
    return out
