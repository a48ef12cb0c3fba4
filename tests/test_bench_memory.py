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
