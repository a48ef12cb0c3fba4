"""The batching loop's next step: the policy picks the calls and the budget (a
`StepOrder`); the executor lays out their rows (`step_plan.plan_rows`)."""

from __future__ import annotations

from collections.abc import Sequence

from corps.engine.exec.step_plan import StepOrder
from corps.engine.sched.job import Job
from corps.engine.sched.policies import Policy


def plan_step(running: Sequence[Job], policy: Policy, budget: int) -> tuple[list[Job], StepOrder]:
    """The next step of the batching loop: the running jobs the policy advances, in
    its order, and the order of the step: those calls and the policy's share of
    `budget`. Calls already done (a prefill that stores its text only) run no rows:
    they are the order's `ready`, finished in the step."""
    ready = tuple(j.call for j in running if j.call.done)  # done at admission: text only
    order = policy.step_calls(policy.step_order(list(running)))
    chosen = [j for j in order if not j.call.done]
    if not chosen:
        return [], StepOrder(ready=ready)
    tokens = policy.step_budget(order, budget)
    return chosen, StepOrder(tuple(j.call for j in chosen), tokens, ready)
