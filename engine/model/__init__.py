"""The model: weights, their layout on this machine, and one forward step.

Owns what a forward needs to know of a model (`spec`), model names
(`names`), the weights fused for our forward (`weights`), the forward itself
over per-call views (`runner`), projections and their kernels chosen by
measurement (`linear`, `tuning`), the lone decode step compiled whole
(`decode_module`, `compiled_decode`) and LoRA adapters (`adapter_files`:
PEFT's format, made, checked and merged at load; `adapter_rows`: an adapter
kept apart, applied to some rows of a step). May import `attention`,
`kernels`, `corps.cache` and the shared modules.
"""
