"""sched/admission.py: waiting calls admitted by each policy under any arrival
sequence, with a fake executor and a controlled clock (nothing here times anything)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corps.cache.errors import CacheFullError
from corps.engine.request.workflow import Workflow
from corps.engine.sched.admission import Admission
from corps.engine.sched.make import make

from helpers import fake_job as job


class FakeCore:
    """Memory of `capacity` units; a call takes `request.size` of them until it ends."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.used = capacity, 0

    def admit(self, call, *, hold=False, evict=None):
        if self.used + call.request.size > self.capacity:
            raise CacheFullError("no room")
        self.used += call.request.size
        call.plan = "planned"
        return call

    def abort(self, call, keep_pins=False) -> None:
        self.used -= call.request.size


def admission(policy, capacity: int, max_running: int = 64) -> Admission:
    return Admission(FakeCore(capacity), policy, max_running=max_running, evict=True)


arrivals = st.lists(
    st.tuples(
        st.integers(0, 30),  # arrival tick
        st.integers(1, 3),  # group size
        st.integers(1, 3),  # units per call
        st.integers(1, 6),  # ticks each call runs
        st.integers(0, 3),  # workflow
        st.booleans(),  # latency objective
    ),
    min_size=1,
    max_size=25,
)


@pytest.mark.parametrize("policy", ["fcfs", "workflow", "objective"])
@settings(max_examples=60, deadline=None)
@given(arrivals=arrivals)
def test_every_call_is_admitted_and_groups_are_never_split(policy, arrivals):
    """Under any arrival sequence, every call is eventually admitted (no starvation),
    and under the group-aware policies a group that fits starts whole, in one tick."""
    s = admission(make(policy, aging_s=20.0) if policy != "fcfs" else make(policy), capacity=9)
    flows = [Workflow(f"w{i}", started=float(i)) for i in range(4)]
    pending, left, started = [], {}, {}
    for n, (tick, size, units, ticks, wf, latency) in enumerate(arrivals):
        objective = "latency" if latency else "throughput"
        for k in range(size):
            j = job(tick + k * 1e-3, group=n, wf=flows[wf], objective=objective, size=units,
                    name=f"{n}.{k}")  # fmt: skip
            j.ticks = ticks
            pending.append((tick, j))
    total = len(pending)
    for now in range(400):
        new = [j for t, j in pending if t == now]
        s.admit(s.held + new, float(now))
        for j in s.running:
            if j.name not in started:
                started[j.name] = now
                left[j.name] = j.ticks
        for j in list(s.running):  # each running call advances; done ones free memory
            left[j.name] -= 1
            if left[j.name] == 0:
                s.leave(j)
                s.executor.abort(j)
        if len(started) + len(s.finished) == total and not s.running:
            break
    assert not s.finished  # every call here fits the store: none fails
    assert len(started) == total  # nobody starved
    if policy != "fcfs":
        by_group: dict[int, set[int]] = {}
        for _, j in pending:
            by_group.setdefault(j.group, set()).add(started[j.name])
        assert all(len(ticks) == 1 for ticks in by_group.values())  # whole, at once
