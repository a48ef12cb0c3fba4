"""`corps bench adapter DIR`: serving with a LoRA adapter vs the base model.

An adapter is merged into the weights at load (`corps.engine.model.adapter_files`), so a step
should cost exactly what the base model's costs. Two engines, one with the
adapter and one without, same model and dtype, are timed alternately (base,
adapted, base, ...; best of `repeats`) on single-stream decode and prefill, as
`corps bench runner` times one engine. An adapter of scope "rewired" is kept
apart and runs only for calls whose context is rewired (`corps.engine.model.adapter_rows`):
for it the same calls are timed again reading a rewired context, and a third
engine without the merged copy of the adapted projections (`adapter_copy=False`)
shows what the low-rank product costs on every row.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from corps.bench.runner import best_of, ours_probes, rates


def measure(model: str, engines: dict[str, dict], dtype: str, decode_tokens: int,
            prefill_tokens: int, repeats: int,
            rewired: bool = False) -> dict[str, tuple[float, float]]:  # fmt: skip
    """{name: (decode tok/s, prefill tok/s)} of each engine (`Engine.open` keywords
    by name), timed alternately in the order given; `rewired`: the calls read a
    rewired context (`ours_probes`)."""
    from contextlib import ExitStack

    from anyio.from_thread import start_blocking_portal

    from corps.engine import Engine

    with start_blocking_portal() as portal, ExitStack() as stack:
        probes = {}
        for name, kw in engines.items():
            engine = stack.enter_context(
                portal.wrap_async_context_manager(Engine.open(model, dtype=dtype, **kw))
            )
            made = portal.call(
                partial(ours_probes, rewired=rewired), engine, decode_tokens, prefill_tokens
            )
            for k, f in made.items():
                probes[(k, name)] = partial(portal.call, f)
        order = list(engines)  # each round: every engine in turn
        keys = sorted(probes, key=lambda p: (p[0], order.index(p[1])))
        t = best_of({p: probes[p] for p in keys}, repeats)
    return {
        name: rates({k: v for (k, w), v in t.items() if w == name}, decode_tokens, prefill_tokens)
        for name in engines
    }


def main(model: str, adapter: Path, dtype: str, decode_tokens: int, prefill_tokens: int,
         repeats: int) -> None:  # fmt: skip
    from corps.engine.model.adapter_files import read_scope

    apart = read_scope(adapter) == "rewired"
    engines = {"base": {}, "adapter": {"adapter": adapter}}
    if apart:  # the same adapter without the merged copy of its projections
        engines["no copy"] = {"adapter": adapter, "adapter_copy": False}
    kinds = (False, True) if apart else (False,)
    got = {r: measure(model, engines, dtype, decode_tokens, prefill_tokens, repeats, r)
           for r in kinds}  # fmt: skip
    how = "adapter kept apart (scope rewired)" if apart else "merged adapter"
    table = Table(
        title=f"{how} vs base ({model}, dtype {dtype}, CPU threads="
        f"{torch.get_num_threads()}, best of {repeats})"
    )
    cols = ["metric", "base tok/s", "adapter tok/s", "adapter / base"]
    if apart:
        cols += ["no copy tok/s", "no copy / base"]
    for col in cols:
        table.add_column(col, justify="right")
    for r in kinds:
        calls = ", rewired calls" if r else (", chain calls" if apart else "")
        names = (f"decode ({decode_tokens} tok{calls})", f"prefill ({prefill_tokens} tok{calls})")
        for i, name in enumerate(names):
            b = got[r]["base"][i]
            row = [name, f"{b:.1f}"]
            for other in list(engines)[1:]:
                row += [f"{got[r][other][i]:.1f}", f"{got[r][other][i] / b:.2f}x"]
            table.add_row(*row)
    Console().print(table)
