"""engine/sched/policies.py: admission order per policy, on hand-built cases and under any
arrival sequence (the scheduler's admission driven with a fake executor and a
controlled clock: nothing here times anything)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from corps.engine.request.workflow import Workflow
from corps.engine.sched.cost import StepCost
from corps.engine.sched.feedback import StepFeedback
from corps.engine.sched.policies import Fcfs, ObjectiveFirst, WorkflowFirst

from helpers import fake_job as job


def names(groups):
    return [[j.name for j in g] for g in groups]


def test_fcfs_is_arrival_order_call_by_call():
    a, b, c = job(2, 1, name="a"), job(1, 1, name="b"), job(3, name="c")
    assert names(Fcfs().order([a, b, c], now=3)) == [["b"], ["a"], ["c"]]


def test_workflow_puts_earlier_workflows_first_and_keeps_groups_whole():
    old, new = Workflow("old", started=0.0), Workflow("new", started=5.0)
    calls = [
        job(6.0, group=10, wf=new, name="new-1"),
        job(6.1, group=11, wf=old, name="old-a"),
        job(6.2, group=10, wf=new, name="new-2"),
        job(6.3, group=11, wf=old, name="old-b"),
        job(6.4, wf=None, name="loose"),  # outside any workflow: its own start
    ]
    order = WorkflowFirst(aging_s=100).order(calls, now=7)
    assert names(order) == [["old-a", "old-b"], ["new-1", "new-2"], ["loose"]]


def test_a_call_that_waited_long_enough_goes_first_whatever_its_workflow():
    old, new = Workflow("old", started=0.0), Workflow("new", started=5.0)
    waited = job(1.0, wf=new, name="waited")
    fresh = job(9.0, wf=old, name="fresh")
    assert names(WorkflowFirst(aging_s=5).order([fresh, waited], now=9.5)) == [
        ["waited"],
        ["fresh"],
    ]
    assert names(WorkflowFirst(aging_s=50).order([fresh, waited], now=9.5)) == [
        ["fresh"],
        ["waited"],
    ]


def test_objective_puts_latency_first_and_bounds_the_batch_beside_it():
    p = ObjectiveFirst(aging_s=100, latency_batch=3)
    chat = job(5.0, objective="latency", name="chat")
    bulk = [job(1.0 + i, objective="throughput", name=f"bulk{i}") for i in range(3)]
    assert names(p.order([*bulk, chat], now=6))[0] == ["chat"]
    running = [job(0.5, objective="latency")]
    assert p.may_admit([bulk[0]], running, [], now=6)  # 2 running of 3
    assert not p.may_admit([bulk[0]], running * 3, [], now=6)  # the bound
    assert p.may_admit([bulk[0]], running * 3 + [], [], now=200)  # aged: not held back
    assert p.may_admit([bulk[0]], [job(0.5)] * 9, [], now=6)  # no latency call about
    ordered = p.step_order([bulk[0], chat])
    assert ordered[0] is chat  # latency calls first in the step's prefill budget
    assert p.step_budget([bulk[0], chat], 512) == 2 + p.latency_prefill  # a small step
    assert p.step_budget(bulk, 512) == 512  # no latency call running: the whole budget
    assert Fcfs().step_budget([chat], 512) == WorkflowFirst().step_budget([chat], 512) == 512


def test_a_latency_task_group_goes_first_but_leaves_the_batch_open():
    """A latency workflow's map stage (latency, not critical) is admitted ahead of
    throughput work and whole, and neither holds throughput calls back nor bounds
    the step's prompt tokens; a critical call (its reduce) does both."""
    policy = ObjectiveFirst(aging_s=100, latency_batch=2, latency_prefill=16)
    maps = [job(5.0 + i / 10, group=7, objective="latency", critical=False, name=f"map{i}")
            for i in range(3)]  # fmt: skip
    bulk = job(1.0, name="bulk")
    assert names(policy.order([bulk, *maps], now=6)) == [["map0", "map1", "map2"], ["bulk"]]
    assert policy.may_admit([bulk], running=maps, waiting=[], now=6)
    assert policy.step_budget(maps, 512) == 512
    reduce = job(7.0, objective="latency", name="reduce")  # made alone: critical
    assert not policy.may_admit([bulk], running=[reduce, *maps], waiting=[], now=7)
    assert policy.step_budget([reduce, *maps], 512) == 4 + 16
    assert policy.step_order([bulk, reduce]) == [reduce, bulk]


def test_a_measured_row_bound_replaces_both_fixed_bounds_beside_critical_calls():
    policy = ObjectiveFirst(aging_s=100, latency_batch=8, latency_prefill=64, latency_rows=4)
    chat = job(5.0, objective="latency", name="chat")
    bulk = [job(1.0 + i, name=f"bulk{i}") for i in range(4)]
    assert policy.step_budget([chat], 512) == 4  # chat's token and 3 prompt tokens
    assert policy.step_budget([chat, *bulk], 512) == 5  # never below one per running call
    assert policy.step_budget(bulk, 512) == 512  # no critical call: the whole budget
    assert policy.may_admit([bulk[0]], running=[chat, bulk[1]], waiting=[], now=6)
    assert not policy.may_admit([bulk[0]], running=[chat, *bulk[1:]], waiting=[], now=6)


def test_victims_fcfs_least_recently_read_first_workflow_latest_started_first():
    m = lambda name, started, read_at: SimpleNamespace(  # noqa: E731
        name=name, started=started, read_at=read_at
    )
    msgs = [m("old-wf-recent", 1.0, 9), m("new-wf", 5.0, 7), m("old-wf-stale", 1.0, 2)]
    assert [v.name for v in Fcfs().victims(msgs)] == ["old-wf-stale", "new-wf", "old-wf-recent"]
    for policy in (WorkflowFirst(), ObjectiveFirst()):
        order = [v.name for v in policy.victims(msgs)]
        assert order == ["new-wf", "old-wf-stale", "old-wf-recent"]


def _learnt(a: float, b: float, c: float) -> StepCost:
    cost = StepCost()
    for calls, rows in [(1, 1), (2, 2), (4, 68), (8, 8), (3, 200)]:
        cost.observe(calls, rows, a + b * calls + c * rows)
    return cost


def test_a_learnt_step_cost_picks_the_calls_that_run_beside_critical_ones():
    """a + b calls + c rows with step_slowdown 1.5: chat alone 0.022 s, so a step may hold
    calls while 0.020 + 0.002 n <= 0.033: six, the chat and the first five in order."""
    policy = ObjectiveFirst(
        aging_s=100, cost=_learnt(0.020, 0.002, 0.0), step_slowdown=1.5, feedback=None
    )
    chat = job(5.0, objective="latency", name="chat")
    bulk = [job(float(i), name=f"b{i}") for i in range(10)]
    order = policy.step_order([*bulk, chat])
    assert [j.name for j in policy.step_calls(order)] == ["chat", "b0", "b1", "b2", "b3", "b4"]
    assert policy.step_calls(bulk) == bulk  # no latency call: every call
    group = job(5.0, objective="latency", critical=False, name="map")
    assert policy.step_calls([group, *bulk]) == [group, *bulk]  # not critical: batch open


def test_a_learnt_cost_never_starves_throughput_calls_and_bounds_the_rows():
    slow = ObjectiveFirst(
        aging_s=100,
        cost=_learnt(0.020, 0.050, 0.0),
        step_slowdown=1.5,
        starve_steps=2,
        feedback=None,
    )
    chat = job(5.0, objective="latency", name="chat")
    bulk = [job(float(i), name=f"b{i}") for i in range(3)]
    steps = [[j.name for j in slow.step_calls([chat, *bulk])] for _ in range(4)]
    # none fits beside the chat; left out of two steps in a row, they run in the third
    assert steps == [["chat"], ["chat"], ["chat", "b0", "b1", "b2"], ["chat"]]
    assert slow.step_calls(bulk) == bulk  # nothing critical: every call
    rows = ObjectiveFirst(
        aging_s=100, cost=_learnt(0.020, 0.0, 0.001), step_slowdown=1.5, feedback=None
    )
    # alone: 0.021 s; 0.0315 s allows 11 rows; never fewer than one per call
    assert rows.step_budget([chat, bulk[0]], 512) == 11
    assert rows.step_budget([chat, *bulk], 2) == 2
    assert rows.step_budget(bulk, 512) == 512


def test_beside_a_chat_a_long_view_is_passed_over_and_a_shorter_one_fits():
    """20 ms + 1 ms a call + 5 ms per 1000 keys, step_slowdown 1.5: a chat over 400 keys
    alone takes 23 ms, so a step beside it may take 34.5 ms. The oldest bulk call reads
    3000 keys: 39 ms, passed over. The next three, 400 keys each, fit (32 ms with all
    three); a fourth would make it 35 ms."""
    cost = StepCost()
    for calls, longest in [(1, 100), (1, 1500), (4, 100), (4, 800), (8, 400), (2, 3000)]:
        keys = calls * longest
        cost.observe(calls, calls, 0.020 + 0.001 * calls + 0.005 * keys / 1000, keys=keys)
    policy = ObjectiveFirst(aging_s=100, cost=cost, step_slowdown=1.5, feedback=None)
    chat = job(5.0, objective="latency", name="chat")
    chat.keys = 400
    bulk = [job(float(i), name=f"b{i}") for i in range(5)]
    for b, keys in zip(bulk, (3000, 400, 400, 400, 400), strict=True):
        b.keys = keys
    assert policy.step_bound([chat]) == pytest.approx(1.5 * 0.023)
    chosen = [j.name for j in policy.step_calls(policy.step_order([*bulk, chat]))]
    assert chosen == ["chat", "b1", "b2", "b3"]
    assert bulk[0].skipped == 1 and bulk[1].skipped == 0
    chat.keys = 4000  # a long history: its step alone is slower, and so is the bound
    assert policy.step_bound([chat]) == pytest.approx(1.5 * 0.041)


def test_the_fixed_bounds_hold_until_the_cost_is_learnt():
    policy = ObjectiveFirst(aging_s=100, latency_prefill=64)
    chat, bulk = job(5.0, objective="latency"), job(1.0)
    assert policy.step_budget([chat, bulk], 512) == 2 + 64
    policy.observe(1, 1, 0.02)
    policy.observe(2, 2, 0.03)  # learnt: a step of (n, n) costs 0.01 + 0.01 n
    assert policy.step_budget([chat, bulk], 512) < 2 + 64
    assert ObjectiveFirst(cost=None).step_calls([chat, bulk]) == [chat, bulk]


def test_the_learnt_bound_is_the_latency_calls_step_alone_their_prompts_included():
    """a + c rows, c = 1 ms a row: the two chats' step alone (a token and a 30-token
    prompt) takes 0.051 s, so a step beside them may take 0.0765 s: 56 rows, of which
    the bulk call's prompt gets what the chats leave (24), not its 400."""
    policy = ObjectiveFirst(
        aging_s=100, cost=_learnt(0.020, 0.0, 0.001), step_slowdown=1.5, feedback=None
    )
    talking = job(5.0, objective="latency", name="talking")
    arriving = job(6.0, objective="latency", name="arriving")
    arriving.rows = 30  # its prompt
    bulk = job(1.0, name="bulk")
    bulk.rows = 400
    assert policy.step_bound([bulk]) is None  # nothing critical: no bound
    assert policy.step_bound([talking, arriving, bulk]) == pytest.approx(0.0765, rel=1e-3)
    order = policy.step_order([bulk, arriving, talking])
    assert [j.name for j in order][-1] == "bulk"  # latency prompts first in the budget
    assert policy.step_budget(order, 512) in (55, 56)  # 56, less the fit's rounding
    # 10 ms a call, no slack: the bulk call's own cost leaves room for 21 rows, but the
    # step never holds less than the chats' rows and the bulk call's token
    tight = ObjectiveFirst(
        aging_s=100, cost=_learnt(0.020, 0.010, 0.001), step_slowdown=1.0, feedback=None
    )
    assert tight.step_budget(order, 512) == 32


def test_the_feedback_probes_the_chat_alone_then_opens_the_bound_and_closes_it_when_slow():
    """20 ms + 2 ms a call, step_slowdown 1.5: the chat alone is predicted at 22 ms and
    the full headroom holds five bulk calls. The feedback starts closed: the chat runs
    alone for three probes and is measured (11 ms); steps at that time are under the
    target, so the share opens until the five fit; steps at 3x close it. With no
    critical call it forgets, and the next chat is probed again."""
    policy = ObjectiveFirst(
        aging_s=100, cost=_learnt(0.020, 0.002, 0.0), step_slowdown=1.5,
        feedback=StepFeedback(target=1.3),
    )  # fmt: skip
    chat = job(5.0, objective="latency", name="chat")
    bulk = [job(float(i), name=f"b{i}") for i in range(10)]
    order = policy.step_order([*bulk, chat])

    def step(wall: float, calls: list | None = None) -> list[str]:
        chosen = [j.name for j in policy.step_calls(order if calls is None else calls)]
        policy.stepped(wall)
        return chosen

    assert [step(0.011) for _ in range(3)] == [["chat"]] * 3  # probes
    assert policy.feedback.alone() == pytest.approx(0.011)
    for _ in range(20):
        step(0.011)  # nothing fits at share 0 yet: the chat alone, well under target
    assert policy.feedback.share == 1.0
    assert step(0.0143) == ["chat", "b0", "b1", "b2", "b3", "b4"]  # on target: open
    for _ in range(10):
        step(0.033)  # 3x the chat alone: each step closes it by the clipped 0.1
    assert policy.feedback.share == pytest.approx(0.0, abs=1e-9)
    assert step(0.011) == ["chat"]
    step(1.0, bulk)  # nothing critical: the feedback forgets the chat
    assert policy.feedback.share == 0.0 and policy.feedback.alone() is None
    assert step(0.011) == ["chat"]  # the next chat is probed first
