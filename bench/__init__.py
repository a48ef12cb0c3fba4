"""corps.bench: the benchmarks, each a module that measures and renders; `corps bench`
(corps.cli.bench) wires their options. They may read any layer of the engine: they
measure its kernels, its tuning and its steps (tests/test_layers.py)."""
