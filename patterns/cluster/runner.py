"""Workflows across engine workers on Ray, with nothing lost when a worker dies.

    async with Cluster(config, workers=2) as cluster:
        async for outcome in cluster.run("multi_qa", inputs):
            print(outcome.id, outcome.result or outcome.error)

Each worker is a Ray actor holding one engine built from `config`
(`corps.patterns.cluster.worker`). The driver (this process) routes each workflow to a
worker (`corps.patterns.cluster.dispatch`: least loaded in tokens in flight, inputs that
share a long prefix to the same worker) and yields each outcome as it finishes.
A workflow runs on one engine: its handles never cross engines (a handle sent
elsewhere raises `ForeignHandle`).

Faults: when a worker dies (its process killed, its node gone), it is replaced
(or dropped, with `replace=False`) and its in-flight workflows run again on
another worker, at most `retries` times each, then reported as failed with the
cause. Every input yields exactly one outcome.

Without an `address` a local Ray instance is started and stopped with the
cluster; with one, the cluster connects to it (and leaves it running). Ray is
an optional extra (`pip install 'corps[ray]'`) imported only here.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corps.cache.errors import InvalidRequest
from corps.engine.config import EngineConfig
from corps.patterns.cluster.checks import absolute_paths, check_ids, checked_params, workflow_name
from corps.patterns.cluster.dispatch import Router, estimate_tokens, prompt_key
from corps.patterns.cluster.errors import ClusterError, WorkerStartFailed
from corps.patterns.cluster.ray_setup import RAY_INIT, check_reachable, import_ray, start_local_ray
from corps.patterns.cluster.worker import EngineWorker


@dataclass(frozen=True)
class Outcome:
    """One input's end: its `result` (JSON) or the `error` that ended it, where it ran
    and how many times it was started."""

    index: int
    id: int | str
    result: Any = None
    error: str | None = None
    worker: str | None = None
    attempts: int = 1

    @property
    def ok(self) -> bool:
        return self.error is None

    def line(self) -> dict[str, Any]:
        """The outcome as a JSON-lines record (`corps run --json`)."""
        out: dict[str, Any] = dict(id=self.id, index=self.index, worker=self.worker,
                                   attempts=self.attempts)  # fmt: skip
        if self.ok:
            out["result"] = self.result
        else:
            out["error"] = self.error
        return out


@dataclass
class ClusterStats:
    """What a cluster did: workflows started (retries included), workers lost and
    replaced, and the driver's CPU time spent in `run` (its dispatch cost)."""

    dispatched: int = 0
    retries: int = 0
    workers_lost: int = 0
    workers_replaced: int = 0
    driver_cpu_s: float = 0.0
    finished: int = 0

    @property
    def dispatch_ms(self) -> float | None:
        """Driver CPU per finished workflow, in ms."""
        return 1000 * self.driver_cpu_s / self.finished if self.finished else None


@dataclass
class _Running:
    index: int
    worker: str
    cost: int


@dataclass
class _Batch:
    """One `Cluster.run`'s bookkeeping, per input index."""

    workflow: str
    ids: list[int | str]
    params: list[dict[str, Any]]
    keys: list[str]  # prompt text, for co-location
    costs: list[int]  # estimated tokens
    pending: deque[int]
    attempts: list[int] = field(default_factory=list)
    passed: list[int] = field(default_factory=list)  # times a later input went first
    calls: dict[asyncio.Future, _Running] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.attempts = [0] * len(self.ids)
        self.passed = [0] * len(self.ids)


@dataclass
class _Worker:
    name: str
    actor: Any
    info: dict[str, Any] = field(default_factory=dict)
    trace: Path | None = None


class Cluster:
    """N engine workers on Ray; see the module docstring.

    `concurrency`: workflows each worker runs at once (batched in its engine).
    `threads_per_worker`: torch threads in each worker (default on a local cluster:
    the machine's cores shared out). `trace`: merge the workers' traces into this
    file at the end (one process per worker; `corps.engine.trace.merge`).
    """

    def __init__(
        self,
        config: EngineConfig | str | None = None,
        workers: int = 2,
        *,
        address: str | None = None,
        gpus_per_worker: float = 0.0,
        threads_per_worker: int | None = None,
        concurrency: int = 4,
        retries: int = 2,
        replace: bool = True,
        co_locate: int = 256,
        start_timeout: float = 300.0,
        trace: str | Path | None = None,
    ) -> None:
        if workers < 1:
            raise InvalidRequest(f"workers={workers}: give at least 1")
        if concurrency < 1 or retries < 0 or gpus_per_worker < 0:
            raise InvalidRequest("concurrency >= 1, retries >= 0 and gpus_per_worker >= 0")
        config = EngineConfig.of(config)
        if gpus_per_worker and not config.device.startswith("cuda"):
            config = config.model_copy(update=dict(device="cuda"))
        self.config = config.model_copy(update=dict(trace=None, **absolute_paths(config)))
        self.size, self.address, self.gpus = workers, address, gpus_per_worker
        cores = os.cpu_count() or 1
        self.threads = threads_per_worker or max(1, cores // workers)
        self.concurrency, self.retries, self.replace = concurrency, retries, replace
        self.start_timeout = start_timeout
        self.trace = Path(trace) if trace is not None else config.trace
        self.router = Router(co_locate)
        self.stats = ClusterStats()
        self._ray: Any = None
        self._started_ray = False
        self._workers: dict[str, _Worker] = {}
        self._lost: list[_Worker] = []
        self._spawning: set[asyncio.Task] = set()
        self._count = 0
        self._tmp: tempfile.TemporaryDirectory | None = None
        self.causes: list[str] = []  # why workers died or failed to start

    # ---- life cycle ----

    async def __aenter__(self) -> Cluster:
        self._ray = import_ray()
        if self.trace is not None:
            self._tmp = tempfile.TemporaryDirectory(prefix="corps-cluster-")
        try:
            self._connect()
            names = [self._next_name() for _ in range(self.size)]
            started = await asyncio.gather(*(self._start(n) for n in names),
                                           return_exceptions=True)  # fmt: skip
            for got in started:
                if isinstance(got, BaseException):
                    raise got
        except BaseException:
            await self._shutdown()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._shutdown()

    def _connect(self) -> None:
        ray = self._ray
        if ray.is_initialized():
            return
        if self.address is None:
            cores = os.cpu_count() or 1
            start_local_ray(max(cores, self.size * self.threads))
        else:
            check_reachable(self.address)
            try:
                ray.init(address=self.address, **RAY_INIT)
            except Exception as exc:
                msg = f"cannot join the Ray cluster at {self.address}: {exc}"
                raise ClusterError(msg) from None
        self._started_ray = True

    def _next_name(self) -> str:
        self._count += 1
        return f"worker-{self._count}"

    async def _start(self, name: str) -> _Worker:
        """Start one worker and wait until its engine is open; WorkerStartFailed if not."""
        ray = self._ray
        config = self.config
        trace = None
        if self._tmp is not None:
            trace = Path(self._tmp.name) / f"{name}.jsonl"
            config = config.model_copy(update=dict(trace=trace))
        actor = (
            ray.remote(EngineWorker)
            .options(num_cpus=self.threads, num_gpus=self.gpus, max_concurrency=1000)
            .remote(config, name, self.threads)
        )
        worker = _Worker(name, actor, trace=trace)
        try:
            worker.info = await asyncio.wait_for(actor.start.remote(), self.start_timeout)
        except TimeoutError:
            ray.kill(actor)
            raise WorkerStartFailed(
                f"{name} did not start within {self.start_timeout:.0f} s: the cluster may lack "
                f"the resources it asks for ({self.threads} CPUs, {self.gpus} GPUs)"
            ) from None
        except Exception as exc:
            ray.kill(actor)
            raise WorkerStartFailed(f"{name} failed to start: {_cause(exc)}") from None
        except BaseException:  # cancelled (the cluster is closing): nothing half-started
            ray.kill(actor)
            raise
        self._workers[name] = worker
        self.router.add(name, self.concurrency)
        return worker

    async def _shutdown(self) -> None:
        for task in self._spawning:
            task.cancel()
        await asyncio.gather(*self._spawning, return_exceptions=True)  # each kills its actor
        self._spawning.clear()
        traces: dict[str, str] = {}
        infos = {w.name: w.info for w in [*self._workers.values(), *self._lost]}
        for w in list(self._workers.values()):
            try:
                text = await asyncio.wait_for(w.actor.stop.remote(), 60)
                if text:
                    traces[w.name] = text
            except Exception:  # a worker that cannot stop is killed below
                pass
            self._ray.kill(w.actor)
        for w in self._lost:  # a killed worker's trace, if its file is reachable here
            if w.trace is not None and w.trace.exists():
                traces[w.name] = w.trace.read_text()
        self._workers.clear()
        if self.trace is not None and traces:
            from corps.engine.trace.merge import merge

            ordered = {n: traces[n] for n in sorted(traces, key=_number)}  # worker-1 first
            merge(ordered, self.trace, info=infos)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        if self._started_ray:
            self._ray.shutdown()
            self._started_ray = False

    # ---- workers ----

    @property
    def workers(self) -> dict[str, dict[str, Any]]:
        """The live workers: name -> pid, host, threads, workflows running."""
        return {n: {**w.info, "running": self.router.running(n)}
                for n, w in self._workers.items()}  # fmt: skip

    def kill(self, name: str) -> None:
        """Kill a worker's actor (as a crash would); its workflows run again elsewhere."""
        self._ray.kill(self._workers[name].actor, no_restart=True)

    def _lose(self, name: str, cause: str) -> None:
        worker = self._workers.pop(name, None)
        if worker is None:  # already counted: another of its calls failed first
            return
        self.router.remove(name)
        self.stats.workers_lost += 1
        self.causes.append(f"{name} died: {cause}")
        self._lost.append(worker)
        try:
            self._ray.kill(worker.actor, no_restart=True)  # a half-alive one stops for sure
        except Exception:
            pass
        if self.replace:
            task = asyncio.create_task(self._replacement())
            self._spawning.add(task)

    async def _replacement(self) -> None:
        try:
            await self._start(self._next_name())
            self.stats.workers_replaced += 1
        except ClusterError as exc:
            self.causes.append(str(exc))

    # ---- running workflows ----

    async def run(
        self,
        workflow: str | Callable[..., Any],
        inputs: Sequence[dict[str, Any]],
        *,
        ids: Sequence[int | str] | None = None,
        skip: set[int | str] | frozenset = frozenset(),
        decode_budget: int = 256,
    ) -> AsyncIterator[Outcome]:
        """Run `workflow` (a built-in pattern's name or a `.py` file's path; workers load
        it themselves) once per input and yield each `Outcome` as it finishes, in
        finishing order. An input's id is `ids[i]`, else its "id" key, else its index;
        ids in `skip` are not run (a resumed run)."""
        name = workflow_name(workflow)
        ids = list(ids) if ids is not None else [p.get("id", i) for i, p in enumerate(inputs)]
        params = [checked_params(name, p) for p in inputs]
        check_ids(ids, len(inputs))
        keys = [prompt_key(p) for p in params]
        b = _Batch(name, ids, params, keys, [estimate_tokens(k, decode_budget) for k in keys],
                   deque(i for i in range(len(inputs)) if ids[i] not in skip))  # fmt: skip
        calls = b.calls
        cpu0 = time.process_time()
        try:
            while b.pending or calls:
                self._dispatch(b)
                if not calls:
                    if not self._spawning:  # nothing runs and no worker is coming
                        cause = "; ".join(self.causes[-3:]) or "no worker"
                        while b.pending:
                            i = b.pending.popleft()
                            yield self._end(Outcome(i, ids[i], error=f"no worker left ({cause})",
                                                    attempts=b.attempts[i]))  # fmt: skip
                        break
                    await asyncio.wait(self._spawning, return_when=asyncio.FIRST_COMPLETED)
                    self._spawning = {t for t in self._spawning if not t.done()}
                    continue
                waits = set(calls) | self._spawning
                done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                self._spawning = {t for t in self._spawning if not t.done()}
                for fut in done & set(calls):
                    outcome = self._settle(b, calls.pop(fut), fut)
                    if outcome is not None:
                        yield self._end(outcome)
        finally:
            self.stats.driver_cpu_s += time.process_time() - cpu0
            for fut in calls:
                fut.cancel()

    def _end(self, outcome: Outcome) -> Outcome:
        self.stats.finished += 1
        return outcome

    def _dispatch(self, b: _Batch) -> None:
        """Start what can start, in order; an input whose prefix's workers are busy lets
        later ones pass it, at most `PASSES` times (then it takes any free worker)."""
        waiting = deque()
        while b.pending and self.router.free():
            i = b.pending.popleft()
            worker = self.router.choose(b.keys[i], wait=b.passed[i] < PASSES)
            if worker is None:
                b.passed[i] += 1
                waiting.append(i)
                continue
            b.attempts[i] += 1
            self.stats.dispatched += 1
            self.router.start(worker, b.keys[i], b.costs[i])
            ref = self._workers[worker].actor.run.remote(b.workflow, b.params[i])
            b.calls[asyncio.ensure_future(ref)] = _Running(i, worker, b.costs[i])
        b.pending.extendleft(reversed(waiting))  # back in front, in their order

    def _settle(self, b: _Batch, call: _Running, fut: asyncio.Future) -> Outcome | None:
        """The outcome of a finished call, or None if it runs again (its worker died)."""
        self.router.finish(call.worker, call.cost)
        i, n = call.index, b.attempts[call.index]
        where = dict(worker=call.worker, attempts=n)
        try:
            got = fut.result()
        except self._ray.exceptions.RayActorError as exc:
            self._lose(call.worker, _cause(exc))
            if n > self.retries:
                error = f"worker died {n} times running it; last: {_cause(exc)}"
                return Outcome(i, b.ids[i], error=error, **where)
            self.stats.retries += 1
            b.pending.appendleft(i)
            return None
        except Exception as exc:  # the call could not even be made (e.g. bad arguments)
            return Outcome(i, b.ids[i], error=_cause(exc), **where)
        if "error" in got:
            return Outcome(i, b.ids[i], error=got["error"], **where)
        return Outcome(i, b.ids[i], result=got["result"], **where)


#: How many times an input waiting for the workers holding its prefix lets a later
#: input start first before it takes any free worker.
PASSES = 4


def _number(worker: str) -> int:
    return int(worker.rpartition("-")[2])


def _cause(exc: BaseException) -> str:
    """The exception a Ray error wraps, in one line."""
    inner = getattr(exc, "cause", None)
    if isinstance(inner, BaseException):
        exc = inner
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1] if text else ''}".rstrip(": ")
