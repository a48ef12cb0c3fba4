"""sched/step.py: the loop's next step through each policy, on hand-built calls (no
scheduler, no model)."""

from __future__ import annotations

import pytest

from corps.engine.exec.step_plan import plan_rows
from corps.engine.sched.cost import StepCost
from corps.engine.sched.policies import Fcfs, ObjectiveFirst
from corps.engine.sched.step import plan_step

from helpers import bare_call as call
from helpers import plan_shape as shape


def planned(order):
    """The rows the executor lays out for a step's order."""
    return plan_rows(order.calls, order.budget)


def job(c, objective="throughput", critical=False, started=0.0):
    """The call `c` with the facts the policies read."""
    c.objective, c.critical, c.submitted, c.group = objective, critical, started, id(c)
    return c


def test_plan_step_under_fcfs_runs_every_running_call_but_the_done():
    a, b, done = call(feed=3), call(fed=4, pending=5), call(feed=1)
    done.done = True
    chosen, order = plan_step([job(a), job(b), job(done)], Fcfs(), budget=512)
    assert chosen == [a, b]
    assert [e.call for e in planned(order).entries] == [b, a]


def test_plan_step_with_nothing_to_run_runs_no_rows_and_finishes_what_is_done():
    done = call(feed=1)
    done.mark_done()  # a text-only prefill, done at admission
    chosen, order = plan_step([job(done)], Fcfs(), budget=512)
    assert chosen == [] and order.calls == () and not planned(order)
    assert order.ready == (done,)  # the step registers its message
    chosen, order = plan_step([], Fcfs(), budget=512)
    assert chosen == [] and not order


@pytest.mark.parametrize("rows", [2, 6])
def test_plan_step_beside_a_critical_call_takes_the_policy_s_budget(rows):
    policy = ObjectiveFirst(latency_rows=rows)
    chat = call(fed=4, pending=1)
    bulk = call(feed=100)
    chosen, order = plan_step([job(chat, "latency", critical=True), job(bulk)], policy, budget=512)
    assert len(chosen) == 2
    plan = planned(order)
    assert plan.rows == rows  # the chat's token and the prompt tokens the bound leaves
    assert shape(plan)[0] == (-1, 1)


def test_plan_step_with_a_learnt_cost_leaves_out_what_does_not_fit():
    """20 ms a step + 50 ms a call: nothing fits beside the chat within 1.5x its step
    alone, so the bulk prefill waits (its first step left out)."""
    cost = StepCost()
    for calls, rows in [(1, 1), (2, 2), (4, 68), (8, 8), (3, 200)]:
        cost.observe(calls, rows, 0.020 + 0.050 * calls)
    policy = ObjectiveFirst(aging_s=100, cost=cost, step_slowdown=1.5, feedback=None)
    chat = call(fed=4, pending=1)
    bulk = call(feed=400)
    running = [job(chat, "latency", critical=True), job(bulk)]
    chosen, order = plan_step(running, policy, budget=512)
    assert chosen == [chat]
    assert shape(planned(order)) == [(-1, 1)]
