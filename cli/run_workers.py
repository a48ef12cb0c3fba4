"""`corps run --inputs F --workers N`: the inputs' workflows across engine workers on Ray.

The driver (`corps.patterns.cluster.runner.Cluster`) routes each input to a worker and
this module streams each outcome to `--json` as it arrives (`ResultLog`, so
`--resume` skips ids already done), under one progress bar, then prints one
summary table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from corps.cli.scenario import Target
from corps.engine.config import EngineConfig
from corps.patterns.cluster.results_log import ResultLog
from corps.patterns.cluster.runner import Cluster, ClusterStats, Outcome


def run_on_workers(
    tgt: Target,
    runs: list[dict[str, Any]],
    ids: list[int | str],
    config: EngineConfig,
    *,
    workers: int,
    address: str | None,
    gpus_per_worker: float,
    threads_per_worker: int | None,
    concurrency: int,
    json_out: Path | None,
    resume: bool,
    out: Console,
    err: Console,
) -> int:
    """Run every input not already done; the number that failed."""
    workflow = tgt.label if not tgt.builtin else tgt.fn.__name__
    log = ResultLog(json_out, resume=resume) if json_out is not None else None
    done = set(log.done) if log is not None else set()
    todo = sum(1 for i in ids if i not in done)
    if resume:
        dropped = (
            f", {log.dropped} failed or torn lines dropped to run again" if log.dropped else ""
        )
        err.print(f"resuming {json_out}: {len(done)} done, {todo} to run{dropped}")
    cluster = Cluster(
        config,
        workers,
        address=address,
        gpus_per_worker=gpus_per_worker,
        threads_per_worker=threads_per_worker,
        concurrency=concurrency,
    )
    outcomes: list[Outcome] = []

    async def main() -> None:
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn())  # fmt: skip
        with Progress(*columns, console=err, transient=True) as progress:
            task = progress.add_task(f"starting {workers} workers", total=todo)
            async with cluster:
                progress.update(task, description=f"runs on {workers} workers")
                async for o in cluster.run(workflow, runs, ids=ids, skip=done):
                    outcomes.append(o)
                    if log is not None:
                        log.write(o.line())
                    progress.advance(task)

    try:
        anyio.run(main)
    finally:
        if log is not None:
            log.close()
    _summary(outcomes, cluster.stats, workers, tgt.label, out)
    for o in outcomes:
        if not o.ok:
            out.print(f"  input {o.id!r} failed: {o.error}", highlight=False)
    for cause in cluster.causes:
        err.print(f"[yellow]{cause}[/]", highlight=False)
    return sum(not o.ok for o in outcomes)


def _summary(outcomes: list[Outcome], stats: ClusterStats, workers: int, label: str, out) -> None:
    ok = [o.result for o in outcomes if o.ok and isinstance(o.result, dict)]
    table = Table(title=f"{len(outcomes)} runs of {label} on {workers} workers")
    cols = ("runs ok", "failed", "retries", "workers lost", "tokens encoded", "tokens reused",
            "driver CPU / run")  # fmt: skip
    for col in cols:
        table.add_column(col, justify="right")
    per_run = stats.dispatch_ms
    table.add_row(
        str(sum(o.ok for o in outcomes)),
        str(sum(not o.ok for o in outcomes)),
        str(stats.retries),
        str(stats.workers_lost),
        str(sum(r.get("tokens_encoded", 0) for r in ok)),
        str(sum(r.get("tokens_reused", 0) for r in ok)),
        "-" if per_run is None else f"{per_run:.1f} ms",
    )
    out.print(table)
