"""Execution: planning calls over the KV store and running steps' plans.

Owns a call (`planner`: `CallPlan`, `Call`), a step's plan and output
(`step_plan`), the executors the loop drives (`executor`: the protocol; `core`:
choreographed and baseline over our store; `hf`: transformers' generate),
memory (`memory`, `prefixes`, `recompute`: slots, reservations, pins, the
baseline's radix tree, recomputing evicted encodings), a step's batch
(`batch`), sampling (`sampler`, `draw`), constraint masks (`grammars`),
registering finished messages (`register`) and the one thread that runs torch
(`torch_thread`). May import `model`, `attention`, `kernels`, `request`,
`corps.cache` and the shared modules; never `sched` or `api`.
"""
