"""`corps bench serve`: many workflows on one engine, open loop, under each policy.

Workflows drawn from a mix of patterns arrive as a Poisson process at a rate
given as a fraction of the engine's measured saturation throughput (`load`): the
most workflows per second it completes in steady state with 8, 16, 32, ...
always in flight (closed loop, `saturation`), tried while the rate still rises.
The same seeded arrival schedule is run under each scheduling policy
(`corps.engine.sched.policies`), policies alternating from one load to the next; with
`chat`, interactive streams with a latency objective arrive beside the
workflows, and the same streams also run on an idle engine (the `idle` row) in
every round, before its policies: a host whose speed drifts over minutes then
moves the reference with the cells it is compared to. Reported per load and
policy: throughput (workflows/min, tokens/s), workflow latency p50/p90/p99
(arrival to result), chat time to first token and time per output token p50/p99,
the tokens sampled, and the queue depth and running calls sampled over the run.
In dtype auto the same schedule may sample other tokens under another policy
(rows round by batch: a debate's moderator may call one round more), so the
ratios say tokens / fcfs too; float32 keeps the work equal. Each policy gets its
own engine (the policy is an engine setting), warmed up by one untimed run of
each pattern; loading and warm-up are not timed.

With `schedules` above one, each load runs that many seeded schedules, each
under every policy (and alone, and the chats idle), and pools them into one cell
per policy: with a few dozen workflows per schedule, a p99 is the slowest one or
two and moves by tens of percent from one schedule to the next; pooled, it is a
percentile.

A policy may carry a cap on workflows in flight, `workflow:8` (the engine's
`max_workflows`, `corps.engine.sched.gate`): its engine lets at most that many
workflows in at once and queues the rest whole, first come first served;
`fcfs` alone stays today's loop, the baseline every ratio is taken against.

With `trace_dir`, each engine writes its trace there (`load0.8-fcfs.jsonl`,
`load0.8-alone.jsonl`, ...; warm-ups included) for `corps trace view`: its steps
table says where a policy's time went.

With `alone` (the default), every workflow of a load's schedule also runs by
itself, one after another, on an idle warmed engine: its latency there is the
least any policy can give it (a step never runs faster beside other calls), so
the p99 of those latencies is a floor under every policy's p99 at that load, and
each workflow's slowdown (latency under load / alone) says how much of its time
the load added. `busy` is the share of a cell's wall time spent in steps.
"""

from __future__ import annotations

import random
import statistics
import time
from pathlib import Path
from typing import Any

import anyio
from pydantic import BaseModel

from corps.bench.serve_mix import MIX
from corps.engine.sched.policies import POLICIES

CHAT_PROMPT = "Tell me about lighthouses in a few sentences."
CHAT_TOKENS = 48


class Cell(BaseModel):
    policy: str
    load: float
    workflows: int
    failed: int
    wall_s: float
    workflows_per_min: float
    tokens_per_s: float
    latency_s: dict[str, float]  # p50 / p90 / p99
    # tokens the cell's calls sampled: in dtype auto the same schedule may sample other
    # tokens under another policy (rows round by batch), e.g. a debate one round longer
    tokens: int = 0
    chat_ttft_s: dict[str, float] = {}
    chat_tpot_s: dict[str, float] = {}
    max_queue: int = 0
    max_waiting: int = 0  # workflows waiting at the engine's gate to start, at most
    mean_running: float = 0.0
    # each workflow's latency over its latency alone (p50 / p90 / p99), with `alone`
    slowdown: dict[str, float] = {}
    busy: float = 0.0  # share of the wall time the engine spent in steps
    schedules: int = 1  # arrival schedules pooled in this cell (`pool`)
    # the samples behind the percentiles, for pooling and your own statistics:
    # each workflow's latency and slowdown (s, x; schedule order), each chat's TTFT
    # and time per output token (s)
    latencies: list[float] = []
    slowdowns: list[float] = []
    ttfts: list[float] = []
    tpots: list[float] = []


class Report(BaseModel):
    model: str
    mix: dict[str, dict[str, Any]]
    saturation_per_s: float  # workflows per second, closed loop, fcfs, at its best concurrency
    saturation_concurrency: int = 0  # the workflows in flight that gave it (0: given, not measured)
    duration_s: float
    chat: int
    cells: list[Cell]
    # per load (as text, "0.8"): the schedule's workflows run one at a time on an idle
    # engine, latency p50 / p90 / p99 (the floor under any policy's); empty without alone
    alone_s: dict[str, dict[str, float]] = {}
    schedules: int = 1  # arrival schedules per load, pooled in each cell


def engine_settings(spec: str) -> dict[str, Any]:
    """The engine settings of a policy as the bench names it: `workflow`, or
    `workflow:8` for the policy with at most 8 workflows in flight. Raises ValueError
    naming what is wrong."""

    name, _, cap = spec.strip().partition(":")
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
    if not cap:
        return {"policy": name}
    if not cap.isdigit() or int(cap) < 1:
        raise ValueError(f"{spec!r}: the cap after ':' is workflows in flight, a whole number >= 1")
    return {"policy": name, "max_workflows": int(cap)}


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    v = sorted(values)

    def at(q: float) -> float:
        return v[min(len(v) - 1, round(q * (len(v) - 1)))]

    return {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99)}


def schedule(
    rate: float, duration: float, mix: list[str], seed: int
) -> list[tuple[float, str, int]]:
    """(arrival time, pattern, seed) of a Poisson process of `rate` per second."""
    rng, t, out = random.Random(seed), 0.0, []
    while True:
        t += rng.expovariate(rate)
        if t > duration:
            return out
        out.append((t, rng.choice(mix), rng.randrange(1 << 30)))


#: Closed-loop concurrencies tried for saturation, in order, while throughput rises.
CONCURRENCIES = (8, 16, 32, 64)
#: A concurrency must beat the best so far by this much to be tried further.
RISE = 1.05


async def saturation(
    rt, mix: dict[str, dict], window_s: float, concurrencies: tuple[int, ...] = CONCURRENCIES
) -> tuple[float, int]:
    """The engine's saturation throughput: workflows per second at the concurrency
    that gives the most (closed loop, `closed_loop`), trying `concurrencies` in turn
    until one gains less than 5% over the best; that rate and its concurrency. The
    engine is warmed up first (untimed): a cold engine's first runs set the rate low
    and every load fraction with it."""
    await warm(rt, mix)
    best, at = 0.0, concurrencies[0]
    for c in concurrencies:
        rate = await closed_loop(rt, mix, c, window_s)
        rose = rate > best * RISE
        if rate > best:
            best, at = rate, c
        if not rose:
            break
    if best == 0:
        from corps.cache.errors import InvalidRequest

        raise InvalidRequest(
            f"no workflow of the mix ended within {window_s:g} s of closed-loop load: "
            "give a longer --saturation-window, or the rate with --saturation"
        )
    return best, at


async def closed_loop(rt, mix: dict[str, dict], concurrency: int, window_s: float) -> float:
    """Workflows per second with `concurrency` always in flight, in steady state: the
    workflows ending within `window_s` after a ramp-up of a third of it (the first
    ones start together and end together), the runs still going then cancelled."""
    from corps.patterns.registry import run_pattern

    names, ended, started = list(mix), [], iter(range(1 << 62))
    t0 = time.perf_counter()
    start, stop = t0 + window_s / 3, t0 + window_s / 3 + window_s

    async def worker() -> None:
        while True:
            i = next(started)
            name = names[i % len(names)]
            await run_pattern(rt, name, {**mix[name], "seed": i})
            ended.append(time.perf_counter())

    with anyio.move_on_after(stop - t0):
        async with anyio.create_task_group() as tg:
            for _ in range(concurrency):
                tg.start_soon(worker)
    return sum(start <= t <= stop for t in ended) / window_s


async def warm(rt, mix: dict[str, dict]) -> None:
    """One untimed run of each pattern of the mix: a fresh engine's first steps pay for
    allocations, thread pools and constraint compiles that later ones do not."""
    from corps.patterns.registry import run_pattern

    for name, params in mix.items():
        await run_pattern(rt, name, {**params, "seed": 0})


async def timed_run(rt, name: str, params: dict) -> tuple[float, bool]:
    """Seconds one workflow took, and whether it succeeded (a failure is counted by
    the caller; the load goes on)."""
    from corps.patterns.registry import run_pattern

    start = time.perf_counter()
    try:
        await run_pattern(rt, name, params)
    except Exception:
        return time.perf_counter() - start, False
    return time.perf_counter() - start, True


async def run_alone(rt, arrivals: list, mix: dict) -> dict[int, float]:
    """Each workflow of `arrivals` run by itself, one after another, on a warmed engine:
    seconds by index in the schedule (failed ones left out)."""
    await warm(rt, mix)
    out = {}
    for i, (_, name, seed) in enumerate(arrivals):
        seconds, ok = await timed_run(rt, name, {**mix[name], "seed": seed})
        if ok:
            out[i] = seconds
    return out


def slowdowns(latencies: dict[int, float], floor: dict[int, float]) -> list[float]:
    """Each workflow's latency over its latency alone (those that ran alone), in
    schedule order."""
    return [latencies[i] / floor[i] for i in sorted(latencies) if floor.get(i, 0) > 0]


def pool(cells: list[Cell]) -> Cell:
    """One cell of several schedules' cells (one policy, one load): percentiles over
    every workflow and chat of them, throughput over their summed wall time. A p99
    over one schedule's few dozen workflows is its slowest one or two; pooled, it is
    a percentile."""
    if len(cells) == 1:
        return cells[0]
    wall = sum(c.wall_s for c in cells)
    done = sum(c.workflows - c.failed for c in cells)

    def mean(value) -> float:  # weighted by each cell's wall time
        return sum(value(c) * c.wall_s for c in cells) / wall

    latencies = [x for c in cells for x in c.latencies]
    slow = [x for c in cells for x in c.slowdowns]
    ttfts, tpots = [x for c in cells for x in c.ttfts], [x for c in cells for x in c.tpots]
    return Cell(
        policy=cells[0].policy, load=cells[0].load, workflows=sum(c.workflows for c in cells),
        failed=sum(c.failed for c in cells), wall_s=wall, workflows_per_min=60 * done / wall,
        tokens_per_s=mean(lambda c: c.tokens_per_s), latency_s=percentiles(latencies),
        tokens=sum(c.tokens for c in cells),
        chat_ttft_s=percentiles(ttfts), chat_tpot_s=percentiles(tpots),
        max_queue=max(c.max_queue for c in cells),
        max_waiting=max(c.max_waiting for c in cells), mean_running=mean(lambda c: c.mean_running),
        slowdown=percentiles(slow), busy=mean(lambda c: c.busy),
        schedules=sum(c.schedules for c in cells), latencies=latencies, slowdowns=slow,
        ttfts=ttfts, tpots=tpots,
    )  # fmt: skip


async def cell(
    rt,
    policy: str,
    load: float,
    arrivals: list,
    mix: dict,
    chats: list[float],
    floor: dict[int, float] | None = None,
) -> Cell:
    """Run one arrival schedule (and chat streams) on an engine with `policy`; with
    `floor` (latencies alone by index), each workflow's slowdown too."""
    engine = rt.engine
    await warm(rt, mix)
    latencies: dict[int, float] = {}
    failed, ttfts, tpots, samples = 0, [], [], []
    before = engine.stats()
    t0 = time.perf_counter()
    done = anyio.Event()

    async def workflow(i: int, at: float, name: str, seed: int) -> None:
        nonlocal failed
        await anyio.sleep(max(0.0, t0 + at - time.perf_counter()))
        latencies[i], ok = await timed_run(rt, name, {**mix[name], "seed": seed})
        failed += not ok

    async def chat(at: float) -> None:
        await anyio.sleep(max(0.0, t0 + at - time.perf_counter()))
        with engine.workflow(f"chat-{at:.2f}", objective="latency"):
            q = await engine.prefill(CHAT_PROMPT)
            start, stamps = time.perf_counter(), []
            async for _ in engine.stream(parents=[q], max_tokens=CHAT_TOKENS, ignore_eos=True):
                stamps.append(time.perf_counter())
            engine.free(q)
        if stamps:
            ttfts.append(stamps[0] - start)
            if len(stamps) > 1:
                tpots.append((stamps[-1] - stamps[0]) / (len(stamps) - 1))

    async def sample() -> None:
        while not done.is_set():
            s = engine.stats()
            gated = engine.gate.waiting if engine.gate is not None else 0
            samples.append((s.queue_depth, s.mean_batch_size, gated))
            await anyio.sleep(0.25)

    async with anyio.create_task_group() as outer:
        outer.start_soon(sample)
        async with anyio.create_task_group() as tg:
            for i, (at, name, seed) in enumerate(arrivals):
                tg.start_soon(workflow, i, at, name, seed)
            for at in chats:
                tg.start_soon(chat, at)
        done.set()
    wall = time.perf_counter() - t0
    after = engine.stats()
    generated = after.tokens_sampled - before.tokens_sampled
    slow = slowdowns(latencies, floor) if floor else []
    return Cell(
        policy=policy,
        load=load,
        workflows=len(arrivals),
        failed=failed,
        wall_s=wall,
        workflows_per_min=60 * (len(arrivals) - failed) / wall,
        tokens_per_s=generated / wall,
        latency_s=percentiles(list(latencies.values())),
        tokens=generated,
        chat_ttft_s=percentiles(ttfts),
        chat_tpot_s=percentiles(tpots),
        max_queue=max((q for q, _, _ in samples), default=0),
        max_waiting=max((w for _, _, w in samples), default=0),
        mean_running=statistics.fmean(r for _, r, _ in samples) if samples else 0.0,
        slowdown=percentiles(slow),
        busy=(after.step_s - before.step_s) / wall,
        latencies=[latencies[i] for i in sorted(latencies)],
        slowdowns=slow,
        ttfts=ttfts,
        tpots=tpots,
    )


async def measure(
    model: str,
    *,
    dtype: str,
    loads: list[float],
    policies: list[str],
    duration: float,
    chat: int = 0,
    mix: dict[str, dict] | None = None,
    seed: int = 0,
    saturation_window_s: float = 30.0,
    concurrencies: tuple[int, ...] = CONCURRENCIES,
    alone: bool = True,
    trace_dir: str | Path | None = None,
    schedules: int = 1,
    saturation_per_s: float | None = None,
) -> Report:
    """Run every load's arrival schedules under each policy (see the module's doc).
    `schedules`: seeded schedules per load (seed + load index x schedules + r), each
    run under every policy and alone, pooled into one cell per policy (`pool`).
    `saturation_per_s`: the rate loads are fractions of, instead of measuring it."""
    from corps.agents import Runtime
    from corps.engine import Engine

    mix = mix or MIX

    if trace_dir is not None:
        Path(trace_dir).mkdir(parents=True, exist_ok=True)

    def trace(load: float, policy: str, r: int) -> Path | None:  # one file per engine
        if trace_dir is None:
            return None
        tag = "" if schedules == 1 else f"-s{r}"
        name = policy.replace(":", "-max")  # workflow:8 -> workflow-max8
        return Path(trace_dir) / f"load{load:g}-{name}{tag}.jsonl"

    async def on_engine(work, *args, policy: str = "fcfs", trace: Path | None = None):
        """`work(runtime, *args)` on a fresh engine with `policy` (`engine_settings`)."""
        opened = Engine.open(model, dtype=dtype, trace=trace, **engine_settings(policy))
        async with opened as engine, Runtime(engine) as rt:
            return await work(rt, *args)

    sat, sat_at = saturation_per_s, 0
    if sat is None:
        sat, sat_at = await on_engine(saturation, mix, saturation_window_s, concurrencies)
    cells, floors, idle = [], {}, []
    chats = [duration * (i + 0.5) / chat for i in range(chat)]
    for k, load in enumerate(loads):
        runs: dict[str, list[Cell]] = {p: [] for p in policies}
        alone_s: list[float] = []
        for r in range(schedules):
            n = k * schedules + r
            arrivals = schedule(load * sat, duration, list(mix), seed + n)
            floor = None
            if alone:
                floor = await on_engine(run_alone, arrivals, mix, trace=trace(load, "alone", r))
                alone_s += floor.values()
            if chat:  # the same chats on an idle engine, every round (the host may drift)
                idle.append(await on_engine(cell, "idle", 0.0, [], mix, chats))
            for policy in policies if n % 2 == 0 else policies[::-1]:  # drift hits all alike
                args = (policy, load, arrivals, mix, chats, floor)
                trace_to = trace(load, policy, r)
                runs[policy].append(await on_engine(cell, *args, policy=policy, trace=trace_to))
        cells += [pool(runs[p]) for p in policies]
        if alone:
            floors[f"{load:g}"] = percentiles(alone_s)
    if idle:  # what "beside a load" costs the chats, pooled over every round
        cells.append(pool(idle))
    rank = {p: i for i, p in enumerate(["idle", *policies])}
    cells.sort(key=lambda c: (c.load, rank[c.policy]))
    return Report(model=model, mix=mix, saturation_per_s=sat, duration_s=duration, chat=chat,
                  saturation_concurrency=sat_at,
                  cells=cells, alone_s=floors, schedules=schedules)  # fmt: skip
