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


async def test_every_policy_runs_the_same_arrivals_and_reports_a_cell(tiny_dirs, tmp_path):
    report = await bs.measure(
        str(tiny_dirs["llama"]), dtype="float32", loads=[0.5], duration=1.0, chat=1,
        policies=["fcfs", "workflow", "objective"], mix=TINY_MIX, saturation_runs=4,
        concurrency=2, trace_dir=tmp_path / "traces",
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
        assert c.workflows == 0 or set(c.slowdown) == {"p50", "p90", "p99"}
        assert 0 < c.busy <= 1
    assert set(report.alone_s) == {"0.5"}  # the floor of the one load
    from corps.engine.trace_file import Trace

    policies = {"alone": "fcfs", "fcfs": "fcfs", "objective": "objective", "workflow": "workflow"}
    names = sorted(f.name for f in (tmp_path / "traces").iterdir())
    assert names == [f"load0.5-{p}.jsonl" for p in policies]
    for name, policy in zip(names, policies.values(), strict=True):  # each engine's own
        trace = Trace.load(tmp_path / "traces" / name)
        assert trace.steps and trace.closed and trace.header.policy == policy
    assert loaded[0].workflows == 0 or set(report.alone_s["0.5"]) == {"p50", "p90", "p99"}
    text = bs.table(report), bs.ratios(report)
    assert text


async def test_without_alone_there_is_no_floor_nor_slowdown(tiny_dirs):
    report = await bs.measure(
        str(tiny_dirs["llama"]), dtype="float32", loads=[0.5], duration=1.0,
        policies=["fcfs"], mix=TINY_MIX, saturation_runs=2, concurrency=2, alone=False,
    )  # fmt: skip
    assert report.alone_s == {} and all(c.slowdown == {} for c in report.cells)


def test_slowdowns_pair_each_workflow_with_itself_alone():
    latencies = {0: 2.0, 1: 9.0, 2: 4.0, 3: 5.0}
    floor = {0: 1.0, 1: 3.0, 2: 4.0}  # 3 failed alone: left out
    assert bs.slowdowns(latencies, floor) == {"p50": 2.0, "p90": 3.0, "p99": 3.0}


def test_bad_options_exit_2_before_anything_loads():
    runner = CliRunner()
    for args in (["--load", "x"], ["--load", "0"], ["--policies", "lifo"], ["--mix", "nope"]):
        result = runner.invoke(app, ["bench", "serve", *args])
        assert result.exit_code == 2, (args, result.output)
        assert "Traceback" not in result.output


def test_a_mix_by_names_or_from_a_file(tmp_path):
    import pytest

    from corps.cache.errors import InvalidRequest

    assert bs.load_mix("multi-qa, debate") == {"multi_qa": bs.MIX["multi_qa"],
                                               "debate": bs.MIX["debate"]}  # fmt: skip
    assert bs.load_mix("map-reduce") == {"map_reduce": {}}  # not in MIX: its defaults
    js = tmp_path / "mix.json"
    js.write_text('{"map-reduce": {"chunk_tokens": 64}, "debate": {"rounds": 1}}')
    assert bs.load_mix(str(js)) == {"map_reduce": {"chunk_tokens": 64}, "debate": {"rounds": 1}}
    toml = tmp_path / "mix.toml"
    toml.write_text("[multi_qa]\nmax_tokens = 8\n")
    assert bs.load_mix(str(toml)) == {"multi_qa": {"max_tokens": 8}}
    bad = tmp_path / "bad.json"
    for text, says in (('{"debate": {"rounds": "many"}}', "rounds"), ("[1]", "must map"),
                       ("{", "not valid json"), ('{"nope": {}}', "no pattern named")):  # fmt: skip
        bad.write_text(text)
        with pytest.raises(InvalidRequest, match=says):
            bs.load_mix(str(bad))
    with pytest.raises(InvalidRequest, match="no file"):
        bs.load_mix(str(tmp_path / "missing.toml"))


def _report(chat: int) -> bs.Report:
    cells = [bs.Cell(policy=p, load=x, workflows=10, failed=0, wall_s=1.0,
                     workflows_per_min=60 * x, tokens_per_s=100.0,
                     latency_s={"p50": x, "p90": 2 * x, "p99": 3 * x},
                     chat_tpot_s={"p50": 0.02, "p99": 0.03} if chat else {})
             for x in (0.5, 1.0) for p in ("fcfs", "workflow")]  # fmt: skip
    return bs.Report(model="m", mix={}, saturation_per_s=1.0, duration_s=10, chat=chat,
                     cells=cells)  # fmt: skip


def test_the_fcfs_row_says_how_low_the_floor_lets_any_policy_go():
    from rich.console import Console

    report = _report(0)
    report.alone_s = {"0.5": {"p50": 0.2, "p90": 0.4, "p99": 0.75}}  # fcfs p99 at 0.5: 1.5
    console = Console(width=200, record=True)
    console.print(bs.ratios(report))
    console.print(bs.table(report))
    out = console.export_text()
    assert "0.50x" in out  # 0.75 / 1.5
    assert "alone" in out and "0.75" in out


def test_the_plot_is_a_png_with_a_line_per_policy(tmp_path):
    for chat in (0, 2):
        out = tmp_path / f"serve{chat}.png"
        report = _report(chat)
        if chat:  # with the floor line too
            report.alone_s = {"0.5": {"p99": 1.0}, "1": {"p99": 1.2}}
        bs.plot(report, str(out))
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_mix_or_plot_without_matplotlib_exit_2(monkeypatch):
    import sys

    result = CliRunner().invoke(app, ["bench", "serve", "--mix", "nope"])
    assert result.exit_code == 2 and "no pattern named 'nope'" in result.output
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    result = CliRunner().invoke(app, ["bench", "serve", "--plot", "x.png"])
    assert result.exit_code == 2 and "pip install 'corps[plot]'" in result.output
