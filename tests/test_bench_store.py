"""`corps bench store` on a tiny model: each engine does what its row says (copied in,
recomputed, encoded again), the tables print; no figure is asserted on time."""

from __future__ import annotations

import anyio
from rich.console import Console

from corps.bench import store as bs


def test_restart_and_tier_rows_do_what_they_say(tiny_dirs):
    model = str(tiny_dirs["llama"])

    async def both():
        return await bs.restart(model, 3, 40, "float32"), await bs.tier(model, 4, 40, "float32")

    restarts, tiers = anyio.run(both)
    copied, lost, fresh = restarts
    assert copied.copied > 0 and lost.copied == 0
    assert copied.encoded < lost.encoded <= fresh.encoded  # contexts recomputed / re-sent
    no_store, store = tiers
    assert no_store.evicted > 0 and no_store.recomputed > 0 and no_store.copied == 0
    assert store.evicted > 0 and store.recomputed == 0 and store.copied > 0
    console = Console(record=True, width=160)
    console.print(*bs.tables(restarts, tiers))
    assert "encodings copied in" in console.export_text()
