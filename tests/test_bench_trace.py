"""`corps bench trace` (corps.bench.trace): structure and equal work, never time."""

from __future__ import annotations

from typer.testing import CliRunner

from corps.bench import trace as bt
from corps.cli.app import app


async def test_traced_and_untraced_runs_do_the_same_work(tiny_dirs):
    cost = await bt.measure(
        "tree_of_thoughts",
        {"branches": 3, "voters": 2, "max_tokens": 4},
        model=str(tiny_dirs["llama"]),
        runs=2,
        warmup=0,
    )
    assert cost.equal_work
    assert len(cost.plain_s) == len(cost.traced_s) == 2
    assert cost.events > 3 + 2 + 1  # at least one line per call
    assert cost.ratio.low <= cost.ratio.mean <= cost.ratio.high


def test_cli_prints_the_ratio(tiny_dirs):
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "trace",
            "multi-qa",
            "--runs",
            "1",
            "--warmup",
            "0",
            "--set",
            "max_tokens=3",
            "--model",
            str(tiny_dirs["llama"]),
        ],
        terminal_width=120,
    )
    assert result.exit_code == 0, result.output
    assert "traced / untraced" in result.output
