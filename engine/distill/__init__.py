"""What distillation needs of the engine: a workflow's messages as a graph
(`graph`) and their choreographed encodings recomputed with autograd
(`differentiable`). May import `model`, `corps.cache` and the shared modules.
"""
