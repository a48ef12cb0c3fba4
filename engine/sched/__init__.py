"""Scheduling: which calls run in the next step, and the loop that runs them.

Owns the batching loop (`scheduler`: admit, plan, run, postprocess), each
call's waiter (`job`), the policies that order admission and choose a step's
calls and budget (`policies`, with the step cost it learns, `cost`, and the
feedback on steps beside latency calls, `feedback`; `fair`, each tenant its
share; `make`, a policy by name), workflow-level admission
(`admission`) and the loop's next step (`step`: the policy's choice, a
`StepPlan` without rows, whose rows the executor lays out with
`corps.engine.exec.step_plan.plan_rows`, the one place a step's rows are
decided). May import `exec`, `request`, `trace` and the engine's shared modules
(`errors`, `config`, `stats`); never `api`.
"""
