"""`corps bench trace`: what recording a trace costs, measured side by side.

One engine, one runtime; each run executes the same workflow (same seed, so
the same tokens) once untraced and once writing a trace file, in alternating
order (A B, B A, ...) so drift hits both alike. Reported: mean end-to-end wall
time of each, events written per run, and the ratio traced / untraced with a
bootstrap 95% interval. The target is <= 1.05. With `live`, the traced run
also draws the live view (`corps run --live`) into an off-screen terminal, so
the ratio covers both.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel

from corps.bench.workflow import Ratio, bootstrap
from corps.engine.config import DEFAULT_DTYPE


class TraceCost(BaseModel):
    pattern: str
    params: dict[str, Any]
    plain_s: list[float]
    traced_s: list[float]
    events: int  # lines written per traced run (mean)
    ratio: Ratio  # traced / untraced wall time
    equal_work: bool
    live: bool = False


class View(Protocol):
    """A live view of an engine (`corps.view.live.LiveView`): attached, run, detached."""

    def attach(self, engine: Any) -> None: ...
    async def run(self) -> None: ...
    def detach(self, engine: Any) -> None: ...


async def _run(engine, work, view: View | None):
    """Await `work`, drawing `view` meanwhile if there is one."""
    if view is None:
        return await work
    import anyio

    view.attach(engine)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(view.run)
            result = await work
            tg.cancel_scope.cancel()
    finally:
        view.detach(engine)
    return result


async def measure(
    pattern: str,
    params: dict[str, Any],
    *,
    model: str,
    runs: int = 5,
    warmup: int = 1,
    dtype: str = DEFAULT_DTYPE,
    live: Callable[[], View] | None = None,
) -> TraceCost:
    """`live`: makes the view the traced runs also draw (off-screen), if given."""
    from corps.agents import Runtime
    from corps.engine import Engine
    from corps.patterns.registry import run_pattern

    plain, traced, events, same = [], [], [], True
    with tempfile.TemporaryDirectory() as tmp:
        async with Engine.open(model, dtype=dtype) as engine, Runtime(engine) as rt:
            for r in range(warmup + runs):
                p = {**params, "seed": params.get("seed", 0) + r}
                got: dict[bool, tuple[float, list]] = {}
                for on in (False, True) if r % 2 == 0 else (True, False):
                    path = Path(tmp) / f"run{r}.jsonl"
                    sink = engine.trace_to(path) if on else None
                    t0 = time.perf_counter()
                    view = live() if on and live is not None else None
                    result = await _run(engine, run_pattern(rt, pattern, p), view)
                    wall = time.perf_counter() - t0
                    if sink is not None:
                        engine.end_trace(sink)
                        if r >= warmup:
                            events.append(sum(1 for _ in path.open()))
                    got[on] = (wall, [h.generated for h in result.messages if h is not None])
                same = same and got[True][1] == got[False][1]
                if r >= warmup:
                    plain.append(got[False][0])
                    traced.append(got[True][0])
    return TraceCost(
        pattern=pattern,
        params=params,
        plain_s=plain,
        traced_s=traced,
        events=round(statistics.fmean(events)),
        ratio=bootstrap(traced, plain),
        equal_work=same,
        live=live is not None,
    )


def table(cost: TraceCost):
    from rich.table import Table

    arm = "traced + live" if cost.live else "traced"
    t = Table(
        title=f"trace cost: {cost.pattern}, {len(cost.plain_s)} runs each, equal work "
        f"{'yes' if cost.equal_work else 'NO'}"
    )
    for col in ("untraced", arm, "events / run", f"{arm} / untraced [95%]"):
        t.add_column(col, justify="right")
    r = cost.ratio
    t.add_row(
        f"{statistics.fmean(cost.plain_s):.3f} s",
        f"{statistics.fmean(cost.traced_s):.3f} s",
        str(cost.events),
        f"{r.mean:.3f}x [{r.low:.3f}, {r.high:.3f}]",
    )
    return t
