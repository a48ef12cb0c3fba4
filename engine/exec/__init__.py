"""Execution: planning calls over the KV store and running steps' plans.

Owns a call (`planner`: `CallPlan`, `Call`; `repair_rows`), a step's plan and
output (`step_plan`), the executors the loop drives (`executor`: the protocol;
`kv_executor`: choreographed and baseline over our store, a coordinator of the parts
below; `hf`: transformers' generate). Each part owns what it changes: memory
(`memory`, `prefixes`: slots, reservations, pins, the baseline's radix tree),
`restorer` (`Restorer`: evicted encodings made again), `repairs`
(`Repairs`: what a call recomputes of its rewired context, capped by
`baseline_work`), `stepper` (one
fused forward: its batch, `batch`; the draw, `sampler` and `draw`; constraint
masks, `grammars`), `postprocess` (`Postprocess`: calls moved on after their
rows ran), `finish` (`Finisher`: done calls registered as messages, `register`),
`counts` and `figures` (what it did, as `EngineStats`), and the one thread that
runs torch (`torch_thread`). May import `model`, `attention`, `kernels`,
`request`, `corps.cache` and the shared modules; never `sched` or `api`.
"""
