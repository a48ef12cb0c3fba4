"""engine/exec/phases.py: the per-phase account: regions exclusive and nested, launches
counted where they were made, nothing without an open account, a step's phase from
its rows, the profiler's kernels attributed by range; and on a tiny engine, every
phase a call goes through accounted (and launched-counted) through `accounting`."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from corps.engine.exec import phases
from corps.engine.exec.instruments import accounting
from corps.engine.exec.phases import Account, kernels_by_phase, phase, step_phase
from corps.engine.kernels.op_count import count_kernel

from conftest import open_tiny


class Clock:
    """A clock the test moves by hand (no wall-clock timing is asserted)."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_nested_regions_count_for_the_innermost_only(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(phases.time, "perf_counter", clock)
    with Account() as a:
        with phase("admit"):
            clock.t += 1.0
            with phase("placement"):
                clock.t += 10.0
            clock.t += 100.0
        clock.t += 1000.0  # outside every region
        with phase("admit"):
            clock.t += 2.0
    assert dict(a.host_s) == {"admit": 103.0, "placement": 10.0}
    assert dict(a.entries) == {"admit": 2, "placement": 1}
    assert dict(a.device_s) == {}  # on a CPU


def test_without_an_open_account_a_region_does_nothing():
    with phase("decode"):
        pass
    assert phases.open_account() is None
    with Account() as a:
        assert phases.open_account() is a
    assert phases.open_account() is None


def test_one_account_at_a_time_on_a_thread():
    with Account():
        with pytest.raises(RuntimeError, match="already open"):
            Account().__enter__()


def test_launches_count_for_the_phase_that_made_them():
    x = torch.ones(4)
    with Account(count_ops=True) as a:
        with phase("decode"):
            y = x * 2
            y.add_(1)
            _ = y.view(2, 2)  # a view launches nothing
            count_kernel("flex_attention")  # a launch the mode cannot see
        with phase("sample"):
            y.argmax()
        x + 1
    assert dict(a.launches) == {"decode": 3, "sample": 1, "outside": 1}
    assert sum(a.launches.values()) == a.kernels  # the counter's own total
    with Account() as b:  # without count_ops: nothing counted
        with phase("decode"):
            x * 2
    assert not b.launches and b.kernels == 0


@pytest.mark.parametrize(
    "decodes, chunks, repairs, expect",
    [(3, 0, 0, "decode"), (0, 2, 0, "prefill"), (1, 1, 0, "mixed"), (1, 1, 1, "recompute"),
     (0, 0, 2, "recompute")],
)  # fmt: skip
def test_a_steps_phase_follows_its_rows(decodes, chunks, repairs, expect):
    assert step_phase(decodes, chunks, repairs) == expect


def _event(name, kernels=0, children=()):
    e = SimpleNamespace(name=name, kernels=[object()] * kernels, cpu_children=list(children),
                        cpu_parent=None, device_type=torch.autograd.DeviceType.CPU)  # fmt: skip
    for c in children:
        c.cpu_parent = e
    return e


def test_the_profilers_kernels_count_for_the_innermost_phase_range():
    inner = _event("corps.placement", children=[_event("aten::index_copy_", kernels=2)])
    admit = _event("corps.admit", kernels=1, children=[inner, _event("aten::add", kernels=1)])
    decode = _event("corps.decode", children=[_event("cudaGraphLaunch", kernels=40)])
    other = _event("aten::mul", kernels=5)  # outside every phase: not counted
    stray = _event("corps.not_a_phase", kernels=7)
    events = [admit, *admit.cpu_children, *inner.cpu_children, decode, other, stray]
    assert dict(kernels_by_phase(events)) == {"admit": 2, "placement": 2, "decode": 40}


async def test_a_calls_work_is_accounted_phase_by_phase(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama", mode="choreographed") as engine:
        sys = await engine.prefill("You are a careful solver.", role="system")
        async with accounting("cpu", count_ops=True) as a:
            await engine.decode(parents=[sys], max_tokens=4, temperature=0.0)
        await engine.decode(parents=[sys], max_tokens=4, temperature=0.0)  # after: not seen
    assert {"admit", "placement", "decode", "sample", "finish"} <= set(a.entries)
    assert a.entries["finish"] == 1
    assert a.entries["decode"] >= 3  # the first token comes with the header's prefill
    assert a.launches["decode"] > 0 and sum(a.launches.values()) == a.kernels
    assert set(a.host_s) <= set(phases.PHASES)


def test_counting_leaves_what_dynamo_traces_alone():
    """A function compiled while the account counts (FlexAttention is, on CUDA): dynamo
    traces through the mode, which must not fail it (the H200 run of 2026-11-28 lost
    every pattern's counted run to this)."""
    f = torch.compile(lambda x: torch.nn.functional.silu(x * 2) + 1, backend="eager",
                      fullgraph=True)  # fmt: skip
    x = torch.ones(4)
    with Account(count_ops=True) as a:
        with phase("prefill"):
            assert torch.equal(f(x), torch.nn.functional.silu(x * 2) + 1)
    assert a.launches["prefill"] == a.kernels > 0  # the graph's ops, run eagerly, count
