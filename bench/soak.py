"""`corps bench soak`: many workflows through one engine and one runtime, with faults.

N workflows (a mix of the built-in patterns at small settings) run at
concurrency C through one engine and one runtime. With probability `faults` a
workflow is replaced by an injected fault, chosen at random among:

- `cancel`: a pattern cancelled at a random point (up to 0.5 s in);
- `timeout`: an agent ask whose timeout expires while its decode runs;
- `raise`: an agent whose handler raises (the ask fails with AgentError);
- `restart`: a fire-and-forget message that fails a supervised agent, which is
  restarted; an ask to it afterwards must succeed (it counts as completed);
- `overflow`: a prefill longer than the store or the model's context can hold;
- `bad`: a decode naming a freed message.

Each outcome is classified: completed; failed as injected (the typed error the
fault should cause, or a cancellation); failed otherwise (must be 0); hung (no
outcome within the deadline, must be 0). The report gives store tokens and
process RSS at the start, after the first 100 workflows, at the peak and at the
end, and the time per workflow near the start and near the end of the run
(windows where C workflows are in flight, so draining does not count).
"""

from __future__ import annotations

import gc
import os
import random
import time
from collections.abc import Callable
from typing import Any

import anyio
from pydantic import BaseModel

from corps.agents import Agent, AgentError, Runtime
from corps.cache.errors import (
    BrokenInvariant,
    CacheFullError,
    InvalidRequest,
    PositionError,
    UnknownHandle,
)
from corps.engine.config import DEFAULT_DTYPE
from corps.patterns.samples import DOCUMENT_PARAGRAPHS

#: The workflow mix: built-in patterns at small settings.
MIX: tuple[tuple[str, dict[str, Any]], ...] = (
    ("multi_qa", {}),
    ("debate", {"rounds": 1}),
    ("parallel_debate", {"agents": 2, "rounds": 1}),
    ("tree_of_thoughts", {"branches": 2, "voters": 2, "vote_tokens": 4}),
    ("branch_solve_merge", {}),
    ("prisoners_dilemma", {"rounds": 1}),
    ("map_reduce", {"document": " ".join(DOCUMENT_PARAGRAPHS[:2]), "chunk_tokens": 128}),
)
FAULTS = ("cancel", "timeout", "raise", "restart", "overflow", "bad")


class SoakReport(BaseModel):
    workflows: int
    concurrency: int
    faults: float
    completed: int
    injected: int  # failed as the injected fault should make them fail
    unexplained: int  # failed otherwise (must be 0)
    hung: int  # no outcome within the deadline (must be 0)
    by_kind: dict[str, int]  # outcomes per workflow kind: "debate:completed", ...
    errors: list[str]  # the unexplained failures and hangs (first 20)
    store_start: int
    store_after_100: int
    store_peak: int
    store_end: int
    rss_start_mb: float
    rss_after_100_mb: float
    rss_peak_mb: float
    rss_end_mb: float
    per_workflow_start_s: float
    per_workflow_end_s: float
    wall_s: float = 0.0  # first workflow started to last one ended
    records_end: int  # message records the engine still holds
    leaks: int
    dead_letters: int
    evicted: int = 0  # messages whose encodings were dropped for room (preemption)
    recomputed: int = 0  # tokens of dropped encodings made again when read
    copied: int = 0  # ... copied back from the store instead (`store=`)


def rss_mb() -> float:
    """Resident set size of this process (Linux /proc; else the peak from getrusage)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Worker(Agent):
    """Decodes a short answer to what it is sent (the target of timeouts)."""

    async def handle(self, msg):
        return await self.decode(parents=[msg], max_tokens=24, ignore_eos=True)


class Faulty(Agent):
    """Raises on `Boom`; otherwise answers like a Worker. Restarted on failure."""

    supervision = "restart"
    max_restarts = 10**9

    async def handle(self, msg):
        if isinstance(msg, Boom):
            raise RuntimeError("injected handler failure")
        return await self.decode(parents=[msg], max_tokens=4)


class Boom(BaseModel):
    pass


class _Soak:
    def __init__(self, engine, rt: Runtime, rng: random.Random, max_tokens: int) -> None:
        self.engine, self.rt, self.rng, self.max_tokens = engine, rt, rng, max_tokens
        self.seq = 0

    async def workflow(self, kind: str) -> str:
        """Run one workflow or fault; its outcome: completed or injected (else raises)."""
        from corps.patterns.registry import run_pattern

        self.seq += 1
        if kind in dict(MIX):
            params = {**dict(MIX)[kind], "max_tokens": self.max_tokens, "seed": self.seq}
            await run_pattern(self.rt, kind, params)
            return "completed"
        return await getattr(self, f"_{kind}")()

    async def _cancel(self) -> str:
        from corps.patterns.registry import run_pattern

        name, params = self.rng.choice(MIX)
        params = {**params, "max_tokens": self.max_tokens, "seed": self.seq}
        with anyio.move_on_after(self.rng.uniform(0.0, 0.5)) as scope:
            await run_pattern(self.rt, name, params)
        return "injected" if scope.cancelled_caught else "completed"

    async def _agent(self, cls: type[Agent]) -> str:
        name = f"{cls.__name__.lower()}-{self.seq}"
        await self.rt.spawn(cls, name)
        return name

    async def _timeout(self) -> str:
        name = await self._agent(Worker)
        q = await self.engine.prefill(f"Count to ten, {self.seq}.")
        try:
            await self.rt.ask(name, q, timeout=self.rng.uniform(0.001, 0.01))
            return "completed"
        except TimeoutError:
            return "injected"
        finally:
            self.rt.stop(name)
            self.engine.free(q)

    async def _raise(self) -> str:
        name = await self._agent(Faulty)
        try:
            await self.rt.ask(name, Boom())
            return "completed"  # pragma: no cover - the handler always raises
        except AgentError:
            return "injected"
        finally:
            self.rt.stop(name)

    async def _restart(self) -> str:
        name = await self._agent(Faulty)
        q = await self.engine.prefill("Say yes.")
        try:
            await self.rt.send(name, Boom())  # fails in the agent: supervision restarts it
            answer = await self.rt.ask(name, q)  # the restarted agent answers
            self.engine.free(answer)
            return "completed"
        finally:
            self.rt.stop(name)
            self.engine.free(q)

    async def _overflow(self) -> str:
        too_many = self.engine.stats().capacity + 1
        try:
            await self.engine.prefill([1] * too_many, frame=False)
        except (CacheFullError, PositionError):
            return "injected"
        return "completed"  # pragma: no cover - never fits

    async def _bad(self) -> str:
        q = await self.engine.prefill("gone")
        self.engine.free(q)
        try:
            await self.engine.decode(parents=[q], max_tokens=2)
        except (UnknownHandle, InvalidRequest):
            return "injected"
        return "completed"  # pragma: no cover


async def soak(
    *,
    model: str,
    workflows: int = 1000,
    concurrency: int = 32,
    faults: float = 0.1,
    max_tokens: int = 8,
    seed: int = 0,
    deadline_s: float = 300.0,
    capacity: int | None = None,
    dtype: str = DEFAULT_DTYPE,
    admission: bool = True,
    evict: bool = True,
    store: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> SoakReport:
    """Run the soak; `progress(n)` is called after each of the n workflows ends."""
    from corps.engine import Engine

    rng = random.Random(seed)
    kinds = [
        rng.choice(FAULTS) if rng.random() < faults else rng.choice(MIX)[0]
        for _ in range(workflows)
    ]
    outcomes: dict[str, int] = {}
    counts = dict(completed=0, injected=0, unexplained=0, hung=0)
    errors: list[str] = []
    done_at: list[float] = []
    marks: dict[str, float] = {}
    peak = dict(store=0, rss=0.0)
    opened = Engine.open(
        model, dtype=dtype, capacity=capacity, admission=admission, evict=evict, store=store
    )
    async with opened as engine:
        async with Runtime(engine) as rt:
            state = _Soak(engine, rt, rng, max_tokens)
            gc.collect()
            store0, rss0 = engine.stats().tokens_used, rss_mb()

            async def sample() -> None:
                while True:
                    peak["store"] = max(peak["store"], engine.stats().tokens_used)
                    peak["rss"] = max(peak["rss"], rss_mb())
                    await anyio.sleep(0.1)

            async def one(i: int, limiter: anyio.CapacityLimiter) -> None:
                async with limiter:
                    kind = kinds[i]
                    with anyio.move_on_after(deadline_s) as scope:
                        try:
                            outcome = await state.workflow(kind)
                        except Exception as exc:  # not what the fault should cause
                            outcome = "unexplained"
                            errors.append(f"{kind}: {type(exc).__name__}: {exc}")
                    if scope.cancelled_caught:
                        outcome = "hung"
                        errors.append(f"{kind}: no outcome within {deadline_s:.0f} s")
                    counts[outcome] += 1
                    key = f"{kind}:{outcome}"
                    outcomes[key] = outcomes.get(key, 0) + 1
                    done_at.append(time.perf_counter())
                    if progress is not None:
                        progress(len(done_at))
                    if len(done_at) == min(100, workflows):
                        gc.collect()
                        marks["store"], marks["rss"] = engine.stats().tokens_used, rss_mb()

            limiter = anyio.CapacityLimiter(concurrency)
            t_start = time.perf_counter()
            async with anyio.create_task_group() as tg:
                tg.start_soon(sample)
                async with anyio.create_task_group() as work:
                    for i in range(workflows):
                        work.start_soon(one, i, limiter)
                tg.cancel_scope.cancel()
            gc.collect()
            stats = engine.stats()
            dead = rt.dead_letter_count
            try:  # the store's bookkeeping, exact after everything
                engine.check()
                broken = None
            except BrokenInvariant as exc:
                broken = str(exc)
    if broken is not None:
        counts["unexplained"] += 1
        errors.insert(0, f"bookkeeping after the run: {broken}")
    start_s, end_s = _per_workflow(done_at, concurrency)
    return SoakReport(
        workflows=workflows,
        concurrency=concurrency,
        faults=faults,
        completed=counts["completed"],
        injected=counts["injected"],
        unexplained=counts["unexplained"],
        hung=counts["hung"],
        by_kind=dict(sorted(outcomes.items())),
        errors=errors[:20],
        store_start=store0,
        store_after_100=marks.get("store", store0),
        store_peak=peak["store"],
        store_end=stats.tokens_used,
        rss_start_mb=rss0,
        rss_after_100_mb=marks.get("rss", rss0),
        rss_peak_mb=peak["rss"],
        rss_end_mb=rss_mb(),
        per_workflow_start_s=start_s,
        per_workflow_end_s=end_s,
        wall_s=(done_at[-1] - t_start) if done_at else 0.0,
        records_end=stats.records,
        leaks=stats.leaks,
        dead_letters=dead,
        evicted=stats.messages_evicted,
        recomputed=stats.tokens_recomputed,
        copied=stats.tokens_copied_back,
    )


def _per_workflow(done_at: list[float], concurrency: int) -> tuple[float, float]:
    """Seconds per completed workflow in a window near the start and one near the end,
    both while the pipeline is full (after the first C completions, before the last C)."""
    n = len(done_at)
    width = max(2, n // 10)
    lo, hi = min(concurrency, n // 4), max(n - concurrency, 3 * n // 4)
    if hi - lo < 2 * width:
        lo, hi = 0, n
        width = max(1, n // 2)
    if n < 2 or width < 1:
        return 0.0, 0.0
    return _spacing(done_at[lo : lo + width]), _spacing(done_at[hi - width : hi])


def _spacing(times: list[float]) -> float:
    """Mean seconds between consecutive completions."""
    return (times[-1] - times[0]) / max(1, len(times) - 1)


def table(r: SoakReport):
    from rich.table import Table

    t = Table(
        title=f"soak: {r.workflows} workflows at concurrency {r.concurrency}, faults {r.faults:.0%}"
    )
    t.add_column("")
    t.add_column("value", justify="right")
    t.add_row("completed", str(r.completed))
    t.add_row("failed as injected", str(r.injected))
    bad = "[bold red]" if r.unexplained else "[green]"
    t.add_row("failed otherwise (must be 0)", f"{bad}{r.unexplained}[/]")
    bad = "[bold red]" if r.hung else "[green]"
    t.add_row("hung (must be 0)", f"{bad}{r.hung}[/]")
    t.add_row(
        "store tokens: start / after 100 / peak / end",
        f"{r.store_start} / {r.store_after_100} / {r.store_peak} / {r.store_end}",
    )
    t.add_row(
        "RSS MB: start / after 100 / peak / end",
        f"{r.rss_start_mb:.0f} / {r.rss_after_100_mb:.0f} / {r.rss_peak_mb:.0f} / "
        f"{r.rss_end_mb:.0f}",
    )
    growth = r.rss_end_mb / r.rss_after_100_mb - 1 if r.rss_after_100_mb else 0.0
    t.add_row("RSS end vs after 100", f"{growth:+.1%}")
    t.add_row(
        "time per workflow: start / end",
        f"{r.per_workflow_start_s:.3f} s / {r.per_workflow_end_s:.3f} s",
    )
    if r.wall_s:
        t.add_row(
            "wall / workflows per minute", f"{r.wall_s:.1f} s / {60 * r.workflows / r.wall_s:.0f}"
        )
    if r.per_workflow_start_s:
        t.add_row("end vs start", f"{r.per_workflow_end_s / r.per_workflow_start_s - 1:+.1%}")
    t.add_row(
        "records held at the end / leaks / dead letters",
        f"{r.records_end} / {r.leaks} / {r.dead_letters}",
    )
    t.add_row(
        "encodings evicted / tokens recomputed / copied back",
        f"{r.evicted} / {r.recomputed} / {r.copied}",
    )
    return t
