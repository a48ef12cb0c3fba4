"""Running workflows over many inputs: one at a time per input line with nothing lost to
another's failure (`each`), streamed to a results file (`results_log`), and across
engine workers on Ray (`runner`: the `Cluster`; `worker`: one engine worker;
`dispatch`: which worker runs a workflow next; `checks`, `ray_setup`, `errors`: what the
driver checks first, Ray started or reached, what a cluster fails with). Imports the
patterns, never the CLI.
"""
