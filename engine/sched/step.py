"""The batching loop's next step: the policy picks the calls and the budget (a
`StepPlan` without rows); the executor lays out their rows (`step_plan.plan_rows`). And what a
step gave each of its calls (`service`, for `fair`)."""

from __future__ import annotations

from collections.abc import Sequence

from corps.engine.exec.call import Call
from corps.engine.exec.step_plan import StepOutput, StepPlan
from corps.engine.sched.policies import Policy


def plan_step(running: Sequence[Call], policy: Policy, budget: int) -> tuple[list[Call], StepPlan]:
    """The next step of the batching loop: the running calls the policy advances, in
    its order, and the order of the step: those calls and the policy's share of
    `budget`. Calls already done (a prefill that stores its text only) run no rows:
    they are the order's `ready`, finished in the step."""
    ready = tuple(c for c in running if c.done)  # done at admission: text only
    order = policy.step_calls(policy.step_order(list(running)))
    chosen = [c for c in order if not c.done]
    if not chosen:
        return [], StepPlan(ready=ready)
    tokens = policy.step_budget(order, budget)
    return chosen, StepPlan(calls=tuple(chosen), budget=tokens, ready=ready)


def service(chosen: list[Call], out: StepOutput) -> list[tuple[Call, int]]:
    """What a step gave each of its calls (`fair`): the tokens it encoded since last
    counted, plus the tokens it sampled."""
    sampled: dict[Call, int] = {}
    for call, _ in out.tokens:
        sampled[call] = sampled.get(call, 0) + 1
    work = []
    for call in chosen:
        work.append((call, max(0, call.encoded - call.charged) + sampled.get(call, 0)))
        call.charged = call.encoded
    return work
