"""The batching loop's next step: the policy picks the calls and the budget, the
plan's rows are decided by `corps.engine.exec.step_plan.plan_rows`."""

from __future__ import annotations

from collections.abc import Sequence

from corps.engine.exec.step_plan import StepPlan, plan_rows
from corps.engine.sched.job import Job
from corps.engine.sched.policies import Policy


def plan_step(running: Sequence[Job], policy: Policy, budget: int) -> tuple[list[Job], StepPlan]:
    """The next step of the batching loop: the running jobs the policy advances, in
    its order, and the plan of their rows within the policy's share of `budget`.
    Calls already done (a prefill that stores its text only) run no rows: they are
    the plan's `ready`, finished in the step."""
    ready = tuple(j.call for j in running if j.call.done)  # done at admission: text only
    order = policy.step_calls(policy.step_order(list(running)))
    chosen = [j for j in order if not j.call.done]
    if not chosen:
        return [], StepPlan((), ready=ready)
    tokens = policy.step_budget(order, budget)
    plan = plan_rows([j.call for j in chosen], tokens)
    return chosen, StepPlan(plan.entries, plan.calls, ready)
