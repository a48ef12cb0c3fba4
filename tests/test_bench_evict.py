"""`corps bench evict` on a tiny model: workflows that say what their next turn reads
restore less than LRU, with and without a store (restores recompute or copy back);
every run's replies are the same calls' (greedy); the table prints. No figure is
asserted on time."""

from __future__ import annotations

import anyio
from rich.console import Console

from corps.bench import evict as be


def test_expected_next_reads_restore_less_than_lru(tiny_dirs):
    model = str(tiny_dirs["llama"])
    arms = anyio.run(lambda: be.compare(model, "float32", 4, 2, 2, 48, 32, 4, 1.0))
    lru, expected, lru_store, expected_store = arms
    assert lru.evicted > 0 and lru.recomputed > 0 and lru.copied == 0
    assert expected.restored < lru.restored
    assert lru_store.recomputed == 0 and expected_store.recomputed == 0  # copied, not run
    assert expected_store.restored < lru_store.restored
    assert all(len(a.replies) == len(lru.replies) == 2 * 2 + 2 * 4 for a in arms)
    console = Console(record=True, width=200)
    console.print(be.table(arms, "test"))
    assert "expected, store" in console.export_text()


def test_the_store_fits_every_workflow_s_turn_in_flight():
    """Room 1.0 is what the workflows keep plus one turn each in flight (tool output
    and reply): queued calls pin their parents, so less could not run them all."""
    assert be.store_size(4, 100, 50, 8, 1.0) == 4 * (100 + 8 + 16) + 4 * (50 + 48) + 64
    assert be.store_size(4, 100, 50, 8, 2.0) > be.store_size(4, 100, 50, 8, 1.0)
