"""engine/sched/gate.py: workflows start only when the store can hold them."""

from __future__ import annotations

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corps.engine.sched.gate import WorkflowGate


async def test_the_first_workflow_always_starts_and_others_wait_for_room():
    gate = WorkflowGate(1000, share=1.0)
    gate.peaks["debate"] = 400  # learned from an earlier one
    order: list[str] = []
    release = {n: anyio.Event() for n in "abc"}

    async def run(name: str) -> None:
        async with gate.enter("debate") as ticket:
            order.append(f"{name} in")
            await release[name].wait()
            ticket.used(300)
        order.append(f"{name} out")

    async with anyio.create_task_group() as tg:
        for n in "abc":
            tg.start_soon(run, n)
            await anyio.wait_all_tasks_blocked()
        assert order == ["a in", "b in"] and gate.waiting == 1  # 3 x 400 > 1000
        release["a"].set()
        await anyio.wait_all_tasks_blocked()
        assert order[-2:] == ["a out", "c in"]  # a's room goes to c
        assert gate.peaks == {"debate": 400}  # the largest seen
        release["b"].set()
        release["c"].set()
    assert gate.running == 0 and gate.waited == 1


async def test_a_kind_never_seen_runs_alone_until_one_ends():
    gate = WorkflowGate(10_000, first_guess=0.01)
    hold = anyio.Event()
    got: list[str] = []

    async def run(kind: str, tag: str) -> None:
        async with gate.enter(kind) as t:
            got.append(tag)
            await hold.wait()
            t.used(50)

    async with anyio.create_task_group() as tg:
        for kind, tag in (("new", "n1"), ("new", "n2")):
            tg.start_soon(run, kind, tag)
            await anyio.wait_all_tasks_blocked()
        assert got == ["n1"]  # room for both, but n2 waits to learn n1's peak
        hold.set()
    assert got == ["n1", "n2"] and gate.peaks == {"new": 50}


async def test_arrival_order_is_kept():
    """A small workflow that would fit does not pass a big one waiting before it."""
    gate = WorkflowGate(100, share=1.0)
    gate.peaks.update(big=95, small=10)
    got: list[str] = []
    hold = {t: anyio.Event() for t in ("s1", "b1", "s2")}

    async def run(kind: str, tag: str) -> None:
        async with gate.enter(kind):
            got.append(tag)
            await hold[tag].wait()

    async with anyio.create_task_group() as tg:
        for kind, tag in (("small", "s1"), ("big", "b1"), ("small", "s2")):
            tg.start_soon(run, kind, tag)
            await anyio.wait_all_tasks_blocked()
        assert got == ["s1"] and gate.waiting == 2
        hold["s1"].set()
        await anyio.wait_all_tasks_blocked()
        assert got == ["s1", "b1"]  # b1 first, though s2 arrived with room enough
        hold["b1"].set()
        await anyio.wait_all_tasks_blocked()
        assert got == ["s1", "b1", "s2"]
        for e in hold.values():
            e.set()


async def test_a_cancelled_waiter_frees_its_place():
    gate = WorkflowGate(100, share=1.0)
    gate.peaks["big"] = 90
    hold = anyio.Event()

    async def first() -> None:
        async with gate.enter("big"):
            await hold.wait()

    async with anyio.create_task_group() as tg:
        tg.start_soon(first)
        await anyio.wait_all_tasks_blocked()
        with anyio.move_on_after(0.05):
            async with gate.enter("big"):
                pytest.fail("there was no room")
        assert gate.waiting == 0 and gate.running == 1
        hold.set()
    assert gate.running == 0


async def test_a_failed_workflow_teaches_nothing():
    gate = WorkflowGate(1000)
    with pytest.raises(RuntimeError):
        async with gate.enter("x") as t:
            t.used(999)
            raise RuntimeError
    assert gate.peaks == {} and gate.running == 0


def test_bad_settings():
    with pytest.raises(ValueError):
        WorkflowGate(0)
    with pytest.raises(ValueError):
        WorkflowGate(10, share=0)
    with pytest.raises(ValueError, match="most"):
        WorkflowGate(10, most=0)


async def test_most_caps_workflows_in_however_much_memory_there_is():
    gate = WorkflowGate(10_000, share=1.0, most=2)
    gate.peaks["qa"] = 10  # a thousand would fit by memory
    got: list[int] = []
    hold = {i: anyio.Event() for i in range(4)}

    async def run(i: int) -> None:
        async with gate.enter("qa"):
            got.append(i)
            await hold[i].wait()

    async with anyio.create_task_group() as tg:
        for i in range(4):
            tg.start_soon(run, i)
            await anyio.wait_all_tasks_blocked()
        assert got == [0, 1] and gate.waiting == 2
        hold[1].set()  # the second leaves first: the third comes in, not the fourth
        await anyio.wait_all_tasks_blocked()
        assert got == [0, 1, 2] and gate.running == 2
        for e in hold.values():
            e.set()
    assert got == [0, 1, 2, 3] and gate.waited == 2


@settings(max_examples=60, deadline=None)
@given(
    most=st.integers(1, 4),
    ops=st.lists(st.one_of(st.just("arrive"), st.integers(0, 7)), max_size=40),
)
def test_counting_only_everyone_enters_in_arrival_order_never_more_than_most(most, ops):
    """A gate without a store (`capacity=None`) under any sequence of arrivals and
    leavings (an integer: the workflow in at that index leaves): never more than
    `most` in, workflows enter in the order they arrived, and once everyone in has
    left, every arrival has entered (no one starves)."""
    gate = WorkflowGate(None, most=most)
    entered: list[int] = []
    inside: list[int] = []  # tickets in, in order of entry

    async def main() -> None:
        async def arrive(i: int) -> None:
            ticket = await gate.admit("any")
            entered.append(i)
            inside.append(ticket)

        arrivals = 0
        async with anyio.create_task_group() as tg:
            for op in [*ops, *range(len(ops))]:  # then everyone leaves, in turn
                if op == "arrive":
                    tg.start_soon(arrive, arrivals)
                    arrivals += 1
                elif inside:
                    gate.leave(inside.pop(op % len(inside)), "any")
                await anyio.wait_all_tasks_blocked()  # the woken and the new have run
                assert gate.running <= most and gate.running == len(inside)
            while inside:
                gate.leave(inside.pop(), "any")
                await anyio.wait_all_tasks_blocked()
        assert entered == list(range(arrivals)) and gate.waiting == 0

    anyio.run(main)


async def test_an_engine_with_max_workflows_lets_that_many_runs_in(tiny_dirs, tmp_path):
    """`max_workflows=2` with memory admission off: the engine still has a gate, which
    counts only; six runs started together: two go in, four wait, all complete, and
    the trace says how long each waited."""
    from corps.agents import Runtime
    from corps.engine.trace.reader import Trace
    from corps.patterns import multi_qa

    from conftest import open_tiny

    trace = tmp_path / "t.jsonl"
    opened = open_tiny(tiny_dirs, "llama", admission=False, max_workflows=2, trace=trace)
    async with opened as engine:
        assert engine.gate is not None and engine.gate.most == 2
        assert engine.gate.capacity is None  # no memory check: admission is off
        async with Runtime(engine) as rt, anyio.create_task_group() as tg:
            for i in range(6):
                tg.start_soon(lambda i=i: multi_qa(rt, max_tokens=4, seed=i, constrained=False))
        assert engine.gate.waited == 4 and engine.gate.running == 0
        assert engine.stats().tokens_used == 0
    gates = Trace.load(trace).gates
    assert len(gates) == 6 and sum(g.waited > 0 for g in gates.values()) == 4


@pytest.mark.parametrize("admission", [True, False])
async def test_many_runs_on_a_small_store_wait_rather_than_fail(tiny_dirs, admission):
    """Twelve multi-QA runs at once on a store that holds three: with admission every
    one completes (the rest wait at the gate); without, some fail CacheFullError."""
    from corps.agents import Runtime
    from corps.cache.errors import CacheFullError
    from corps.patterns import multi_qa

    from conftest import open_tiny

    failed: list[BaseException] = []
    async with open_tiny(tiny_dirs, "llama", capacity=512, admission=admission) as engine:
        async with Runtime(engine) as rt:

            async def one(i: int) -> None:
                try:
                    await multi_qa(rt, max_tokens=8, seed=i, constrained=False)
                except CacheFullError as exc:
                    failed.append(exc)

            async with anyio.create_task_group() as tg:
                for i in range(12):
                    tg.start_soon(one, i)
        if admission:
            assert not failed and engine.gate.waited > 0 and engine.gate.running == 0
            assert engine.gate.peaks["multi_qa"] > 0
        else:
            assert failed and engine.gate is None
        assert engine.stats().tokens_used == 0
