"""`corps bench memory` (corps.cli.bench_memory): counts on a tiny model, never time."""

from __future__ import annotations

import pytest

from corps.cli import bench_memory as bm


async def test_admission_under_pressure_fails_nothing_and_changes_nothing(tiny_dirs):
    adm = await bm.admission(
        str(tiny_dirs["llama"]), calls=12, max_tokens=40, capacity=256, prompts=3
    )
    assert adm.failed == 0 and adm.differing == 0
    assert adm.store_peak <= adm.capacity


async def test_shared_context_reports_view_memory(tiny_dirs):
    ctx = await bm.shared_context(str(tiny_dirs["llama"]), branches=3, voters=4, branch_tokens=20)
    assert ctx.store_tokens >= 3 * 20
    # the voters' context is held once (a copy per voter would be >= voters x)
    assert ctx.store_tokens <= ctx.view_tokens_peak < 2 * ctx.store_tokens
    assert ctx.ratio == ctx.view_tokens_peak / ctx.store_tokens
    assert ctx.total_ratio == pytest.approx(1 + ctx.ratio)


async def test_long_prefill_during_decodes_finishes_in_mixed_steps(tiny_dirs):
    long = await bm.long_prefill(str(tiny_dirs["llama"]), decodes=4, prompt_tokens=1200)
    assert long.finished
    assert long.mixed_steps >= 1200 // (512 - 4)  # the prompt rode along with the decodes
    assert bm.tables(*_placeholders(), long)[-1].row_count == 1


def _placeholders():
    adm = bm.Admission(calls=1, capacity=256, failed=0, differing=0, store_peak=1, wall_s=0.0)
    ctx = bm.SharedContext(
        branches=1, voters=1, store_tokens=1, view_tokens_peak=1, ratio=1.0,
        total_ratio=2.0, step_s=0.0,
    )  # fmt: skip
    return adm, ctx
