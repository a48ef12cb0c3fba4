"""cli/bench_serve.py: the open-loop bench's structure on a tiny model (never its times)."""

from __future__ import annotations

from typer.testing import CliRunner

from corps.cli import bench_serve as bs
from corps.cli.app import app

TINY_MIX = {"multi_qa": dict(max_tokens=4), "tree_of_thoughts": dict(branches=2, voters=2,
                                                                       max_tokens=4)}  # fmt: skip


def test_the_schedule_is_seeded_poisson_within_the_duration():
    a = bs.schedule(rate=5.0, duration=4.0, mix=["x", "y"], seed=3)
    assert a == bs.schedule(rate=5.0, duration=4.0, mix=["x", "y"], seed=3)
    assert (
        a
        and all(0 < t <= 4.0 for t, _, _ in a)
        and [t for t, _, _ in a] == sorted(t for t, _, _ in a)
    )
    assert bs.schedule(rate=5.0, duration=4.0, mix=["x"], seed=4) != a


def test_percentiles():
    assert bs.percentiles([]) == {}
    p = bs.percentiles([float(i) for i in range(101)])
    assert (p["p50"], p["p90"], p["p99"]) == (50.0, 90.0, 99.0)


async def test_every_policy_runs_the_same_arrivals_and_reports_a_cell(tiny_dirs):
    report = await bs.measure(
        str(tiny_dirs["llama"]), dtype="float32", loads=[0.5], duration=1.0, chat=1,
        policies=["fcfs", "workflow", "objective"], mix=TINY_MIX, saturation_runs=4,
        concurrency=2,
    )  # fmt: skip
    assert report.saturation_per_s > 0
    assert [c.policy for c in report.cells] == ["idle", "fcfs", "workflow", "objective"]
    loaded = report.cells[1:]
    assert report.cells[0].workflows == 0 and report.cells[0].chat_ttft_s  # chat alone
    assert len({c.workflows for c in loaded}) == 1  # the same schedule for each
    for c in loaded:
        assert c.failed == 0 and c.wall_s > 0
        assert c.workflows == 0 or set(c.latency_s) == {"p50", "p90", "p99"}
        assert set(c.chat_ttft_s) == {"p50", "p90", "p99"}  # the chat stream ran
    text = bs.table(report), bs.ratios(report)
    assert text


def test_bad_options_exit_2_before_anything_loads():
    runner = CliRunner()
    for args in (["--load", "x"], ["--load", "0"], ["--policies", "lifo"], ["--mix", "nope"]):
        result = runner.invoke(app, ["bench", "serve", *args])
        assert result.exit_code == 2, (args, result.output)
        assert "Traceback" not in result.output
