"""`corps bench soak` (corps.bench.soak): counts on a tiny model, never time."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from corps.bench import soak as bs
from corps.cli.app import app

pytestmark = pytest.mark.filterwarnings("ignore::corps.cache.visibility.LeakWarning")


async def test_twenty_workflows_with_faults_all_end_and_give_their_memory_back(tiny_dirs):
    report = await bs.soak(
        model=str(tiny_dirs["llama"]), workflows=20, concurrency=6, faults=0.5, max_tokens=3
    )
    assert report.unexplained == 0, report.errors
    assert report.hung == 0
    assert report.completed + report.injected == 20
    assert report.injected > 0  # some faults did what they should
    assert report.store_end == report.store_start  # every workflow freed what it made
    assert report.records_end == 0  # and the engine forgot the records
    assert sum(report.by_kind.values()) == 20


@pytest.mark.parametrize("fault", bs.FAULTS)
async def test_every_fault_fails_the_way_it_should(tiny_dirs, fault):
    import random

    from corps.agents import Runtime
    from corps.engine.api.engine import Engine

    async with Engine.open(str(tiny_dirs["llama"]), capacity=2048) as engine:
        async with Runtime(engine) as rt:
            state = bs._Soak(engine, rt, random.Random(0), max_tokens=3)
            outcome = await state.workflow(fault)
    expected = {"restart": "completed", "cancel": ("completed", "injected")}
    assert outcome in expected.get(fault, ("injected",))


def test_cli_prints_the_table_and_exits_0(tiny_dirs):
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "soak",
            "--workflows",
            "6",
            "--concurrency",
            "3",
            "--faults",
            "0.5",
            "--model",
            str(tiny_dirs["llama"]),
        ],
        terminal_width=120,
    )
    assert result.exit_code == 0, result.output
    assert "failed otherwise (must be 0)" in result.output
