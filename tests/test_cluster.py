"""patterns/cluster/runner.py: workflows across engine workers on a local Ray instance.

Marked `ray` (select with -m ray): each test starts tiny-model workers of one
thread each in their own processes (a few seconds each); one local Ray instance
(2 CPUs, no dashboard) serves the module.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from corps.cache.errors import InvalidRequest
from corps.engine.config import EngineConfig
from corps.patterns.cluster.errors import ClusterError, WorkerStartFailed
from corps.patterns.cluster.runner import Cluster, Outcome

from conftest import open_tiny

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray

QUESTIONS = [["What is 2+2?", f"Name colour number {i}."] for i in range(20)]


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False, namespace="corps-tests")  # fmt: skip
    yield
    ray.shutdown()


def _config(tiny_dirs) -> EngineConfig:
    return EngineConfig.of(str(tiny_dirs["llama"]), dtype="float32", capacity=4096)


def _inputs(temperature: float) -> list[dict]:
    return [dict(id=f"q{i}", questions=q, answers=None, max_tokens=6, temperature=temperature,
                 seed=i, constrained=False) for i, q in enumerate(QUESTIONS)]  # fmt: skip


def _texts(result: dict) -> list[str]:
    return [m["text"] for m in result["messages"]]


async def _collect(cluster, workflow, inputs, **kw) -> list[Outcome]:
    return [o async for o in cluster.run(workflow, inputs, **kw)]


@pytest.mark.parametrize("temperature", [0.0, 0.7])
async def test_every_input_once_and_equal_to_one_embedded_engine(tiny_dirs, local_ray, temperature):
    """2 workers, 20 inputs: 20 outcomes, each id once, each the same workflow an embedded
    engine gives with the same seed (greedy, and sampled with a seed)."""
    from corps.agents import Runtime
    from corps.patterns import multi_qa

    inputs = _inputs(temperature)
    async with Cluster(
        _config(tiny_dirs), threads_per_worker=1, workers=2, concurrency=3
    ) as cluster:
        assert len(cluster.workers) == 2
        got = await _collect(cluster, "multi_qa", inputs)
    assert sorted(o.id for o in got) == sorted(p["id"] for p in inputs)
    assert all(o.ok and o.attempts == 1 for o in got)
    assert {o.worker for o in got} == {"worker-1", "worker-2"}  # both did work
    async with open_tiny(tiny_dirs, "llama") as engine, Runtime(engine) as rt:
        for o in got:
            params = {k: v for k, v in inputs[o.index].items() if k != "id"}
            alone = await multi_qa(rt, **params)
            assert _texts(o.result) == [h.text for h in alone.messages]
            assert o.result["answer"] == alone.answer


SLOW = """
import anyio
from corps.patterns import multi_qa

async def run(rt, **params):
    await anyio.sleep(0.3)  # long enough that a killed worker has workflows in flight
    return await multi_qa(rt, **params)
"""


async def test_a_killed_worker_loses_nothing(tiny_dirs, local_ray, tmp_path):
    """A worker's process killed mid-run: still one outcome per input, none twice, the
    dead worker's workflows retried elsewhere, the worker replaced."""
    script = tmp_path / "slow.py"
    script.write_text(SLOW)
    inputs = [{k: v for k, v in p.items() if k != "id"} for p in _inputs(0.0)]
    got: list[Outcome] = []
    async with Cluster(
        _config(tiny_dirs), threads_per_worker=1, workers=2, concurrency=2
    ) as cluster:
        async for o in cluster.run(str(script), inputs):
            if not got:  # the first result: kill the busiest worker's process
                _, info = max(cluster.workers.items(), key=lambda kv: kv[1]["running"])
                assert info["running"] > 0
                os.kill(info["pid"], signal.SIGKILL)
            got.append(o)
        stats = cluster.stats
    assert sorted(o.id for o in got) == list(range(20))  # ids: the input indexes
    assert all(o.ok for o in got), [o.error for o in got if not o.ok]
    assert stats.workers_lost == 1 and stats.retries >= 1
    assert stats.dispatched == 20 + stats.retries
    assert sum(o.attempts for o in got) == stats.dispatched
    assert {o.worker for o in got if o.attempts > 1} <= {"worker-2", "worker-1", "worker-3"}


async def test_without_replacement_and_with_no_retries_the_cause_is_reported(
    tiny_dirs, local_ray, tmp_path
):
    script = tmp_path / "slow.py"
    script.write_text(SLOW)
    inputs = [{k: v for k, v in p.items() if k != "id"} for p in _inputs(0.0)][:6]
    got = []
    one = Cluster(_config(tiny_dirs), workers=1, threads_per_worker=1, concurrency=2,
                  retries=0, replace=False)  # fmt: skip
    async with one as cluster:
        async for o in cluster.run(str(script), inputs):
            got.append(o)
            if len(got) == 1:
                cluster.kill("worker-1")
    assert len(got) == 6 and len({o.id for o in got}) == 6
    failed = [o for o in got if not o.ok]
    assert failed and all("worker died" in o.error or "no worker left" in o.error
                          for o in failed)  # fmt: skip


FOREIGN = """
async def run(rt, parent):
    h = await rt.engine.decode(parents=[parent], max_tokens=2)
    return h.text
"""


async def test_a_handle_sent_to_another_engine_fails_typed(tiny_dirs, local_ray, tmp_path):
    script = tmp_path / "foreign.py"
    script.write_text(FOREIGN)
    async with open_tiny(tiny_dirs, "llama") as engine:
        h = await engine.prefill("made here")
        async with Cluster(_config(tiny_dirs), threads_per_worker=1, workers=1) as cluster:
            (o,) = await _collect(cluster, str(script), [dict(parent=h)])
    assert o.error.startswith("ForeignHandle: ") and "never cross engines" in o.error


async def test_a_worker_that_cannot_load_its_model_stops_the_start(tmp_path, local_ray):
    with pytest.raises(WorkerStartFailed, match=r"worker-1 failed to start: .*nowhere"):
        async with Cluster(str(tmp_path / "nowhere"), workers=1, threads_per_worker=1):
            pass
    deadline = time.monotonic() + 30  # nothing half-started keeps its CPUs
    while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0) == 2


async def test_bad_inputs_fail_before_any_worker_runs(tiny_dirs, local_ray):
    from corps.patterns.registry import BadParameters

    async with Cluster(_config(tiny_dirs), threads_per_worker=1, workers=1) as cluster:
        with pytest.raises(BadParameters):
            await _collect(cluster, "multi_qa", [dict(rounds=3)])
        with pytest.raises(InvalidRequest, match="appears twice"):
            await _collect(cluster, "multi_qa", [dict(id=1), dict(id=1)])
        skipped = await _collect(cluster, "multi_qa", _inputs(0.0)[:3], skip={"q0", "q2"})
        assert [o.id for o in skipped] == ["q1"] and cluster.stats.dispatched == 1


def test_an_address_nothing_answers_at_fails_fast():
    from corps.patterns.cluster.ray_setup import check_reachable

    with pytest.raises(ClusterError, match="no Ray cluster answers"):
        check_reachable("127.0.0.1:1")
    with pytest.raises(ClusterError, match="bad Ray address"):
        check_reachable("nowhere")


def test_relative_model_paths_are_made_absolute_for_the_workers(tiny_dirs, monkeypatch):
    monkeypatch.chdir(tiny_dirs["llama"].parent)
    cluster = Cluster(EngineConfig.of("llama", dtype="float32"), workers=1)
    assert cluster.config.model == str(tiny_dirs["llama"].resolve())
    assert Cluster("smollm2-135m", workers=1).config.model == "smollm2-135m"  # an alias stays
