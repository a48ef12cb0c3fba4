"""`corps bench memory` (corps.bench.memory): counts on a tiny model, never time."""

from __future__ import annotations

import pytest

from corps.bench import memory as bm


async def test_admission_under_pressure_fails_nothing_and_changes_nothing(tiny_dirs):
    adm = await bm.admission(
        str(tiny_dirs["llama"]), calls=12, max_tokens=40, capacity=256, prompts=3
    )
    assert adm.failed == 0 and adm.differing == 0
    assert adm.store_peak <= adm.capacity


async def test_shared_context_reports_kv_memory_per_way_of_holding_contexts(tiny_dirs):
    kw = dict(branches=3, voters=4, branch_tokens=20)
    copy = await bm.shared_context(str(tiny_dirs["llama"]), **kw)
    store = await bm.shared_context(str(tiny_dirs["llama"]), contexts="store", **kw)
    assert copy.store_tokens == store.store_tokens >= 3 * 20 + 4 * 4
    # "store": the voters' own tokens beside the store (their votes: each >= 4 tokens),
    # and one layer of the context they share in the scratch
    own, context = store.view_tokens_peak, store.scratch_tokens_peak
    assert own >= 4 * 4 and context >= 3 * 20 and own + context == copy.store_tokens
    # "copy": that context is held once more (a copy per voter would be >= voters x)
    assert (copy.view_tokens_peak, copy.scratch_tokens_peak) == (context + own, 0)
    assert copy.ratio == pytest.approx(2.0)
    assert store.ratio == pytest.approx(1 + (own + context / store.layers) / store.store_tokens)
    assert store.ratio < copy.ratio  # (this tiny shape is mostly votes; the real one is ~1x)
    assert bm.tables(*_placeholders())[1].row_count == 1


async def test_long_prefill_during_decodes_finishes_in_mixed_steps(tiny_dirs):
    long = await bm.long_prefill(str(tiny_dirs["llama"]), decodes=4, prompt_tokens=1200)
    assert long.finished
    assert long.mixed_steps >= 1200 // (512 - 4)  # the prompt rode along with the decodes
    assert bm.tables(*_placeholders(), long)[-1].row_count == 1


def _placeholders():
    adm = bm.Admission(calls=1, capacity=256, failed=0, differing=0, store_peak=1, wall_s=0.0)
    ctx = bm.SharedContext(
        contexts="copy", branches=1, voters=1, store_tokens=1, view_tokens_peak=1,
        scratch_tokens_peak=0, layers=1, step_s=0.0,
    )  # fmt: skip
    return adm, [ctx]


async def test_context_decode_gives_the_same_row_for_both_ways(tiny_dirs):
    rows = [
        await bm.context_decode(str(tiny_dirs["llama"]), contexts=c, context_tokens=64,
                                max_tokens=5)
        for c in ("copy", "store")
    ]  # fmt: skip
    assert [r.contexts for r in rows] == ["copy", "store"] and all(r.wall_s > 0 for r in rows)
    table = bm.tables(*_placeholders(), decodes=rows)[-1]
    assert table.row_count == 1
