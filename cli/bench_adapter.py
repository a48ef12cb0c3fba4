"""`corps bench adapter DIR`: serving with a LoRA adapter vs the base model.

An adapter is merged into the weights at load (`corps.engine.adapter`), so a step
should cost exactly what the base model's costs. Two engines, one with the
adapter and one without, same model and dtype, are timed alternately (base,
adapted, base, ...; best of `repeats`) on single-stream decode and prefill, as
`corps bench runner` times one engine. An adapter of scope "rewired" is kept
apart and runs only for calls whose context is rewired (`corps.engine.lora`):
for it the same calls are timed again reading a rewired context, where its
low-rank product runs on every row.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from corps.cli.bench_runner import best_of, ours_probes, rates


def measure(model: str, adapter: Path, dtype: str, decode_tokens: int, prefill_tokens: int,
            repeats: int, rewired: bool = False) -> dict[str, tuple[float, float]]:  # fmt: skip
    """{"base": (decode tok/s, prefill tok/s), "adapter": (...)}, timed alternately;
    `rewired`: the calls read a rewired context (`ours_probes`)."""
    from anyio.from_thread import start_blocking_portal

    from corps.engine.engine import Engine

    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(Engine.open(model, dtype=dtype)) as base,
        portal.wrap_async_context_manager(
            Engine.open(model, dtype=dtype, adapter=adapter)
        ) as adapted,
    ):
        probes = {}
        for name, engine in (("base", base), ("adapter", adapted)):
            made = portal.call(
                partial(ours_probes, rewired=rewired), engine, decode_tokens, prefill_tokens
            )
            for k, f in made.items():
                probes[(k, name)] = partial(portal.call, f)  # each round: base, then adapter
        order = sorted(probes, key=lambda p: (p[0], p[1] != "base"))
        t = best_of({p: probes[p] for p in order}, repeats)
    return {
        name: rates({k: v for (k, w), v in t.items() if w == name}, decode_tokens, prefill_tokens)
        for name in ("base", "adapter")
    }


def main(model: str, adapter: Path, dtype: str, decode_tokens: int, prefill_tokens: int,
         repeats: int) -> None:  # fmt: skip
    from corps.engine.adapter import read_scope

    apart = read_scope(adapter) == "rewired"
    kinds = (False, True) if apart else (False,)
    got = {r: measure(model, adapter, dtype, decode_tokens, prefill_tokens, repeats, r)
           for r in kinds}  # fmt: skip
    how = "adapter kept apart (scope rewired)" if apart else "merged adapter"
    table = Table(
        title=f"{how} vs base ({model}, dtype {dtype}, CPU threads="
        f"{torch.get_num_threads()}, best of {repeats})"
    )
    for col in ("metric", "base tok/s", "adapter tok/s", "adapter / base"):
        table.add_column(col, justify="right")
    for r in kinds:
        calls = ", rewired calls" if r else (", chain calls" if apart else "")
        names = (f"decode ({decode_tokens} tok{calls})", f"prefill ({prefill_tokens} tok{calls})")
        for i, name in enumerate(names):
            b, a = got[r]["base"][i], got[r]["adapter"][i]
            table.add_row(name, f"{b:.1f}", f"{a:.1f}", f"{a / b:.2f}x")
    Console().print(table)
