"""bench/serve.py: the open-loop bench's structure on a tiny model (never its times)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from corps.bench import serve as bs
from corps.bench import serve_mix as bsm
from corps.bench import serve_report as bsr
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


@pytest.mark.parametrize(
    ("rates", "want", "tried"),
    [
        ({8: 100, 16: 140, 32: 135, 64: 150}, (140, 16), [8, 16, 32]),  # fell: stop there
        ({8: 100, 16: 103, 32: 200}, (103, 16), [8, 16]),  # rose < 5%: stop, keep the best
        ({8: 50, 16: 80, 32: 120, 64: 160}, (160, 64), [8, 16, 32, 64]),  # rose to the end
    ],
)
async def test_saturation_is_the_best_rate_of_the_concurrencies_while_it_rises(
    monkeypatch, rates, want, tried
):
    asked: list[int] = []

    async def rate(rt, mix, c, window_s):
        asked.append(c)
        return rates[c]

    async def no_warm(rt, mix):
        return None

    monkeypatch.setattr(bs, "closed_loop", rate)
    monkeypatch.setattr(bs, "warm", no_warm)
    assert await bs.saturation(None, {}, 1.0) == want and asked == tried


async def test_no_workflow_ending_in_the_window_is_an_error_that_says_what_to_do(monkeypatch):
    from corps.cache.errors import InvalidRequest

    async def nothing(rt, mix, c, window_s):
        return 0.0

    async def no_warm(rt, mix):
        return None

    monkeypatch.setattr(bs, "closed_loop", nothing)
    monkeypatch.setattr(bs, "warm", no_warm)
    with pytest.raises(InvalidRequest, match="--saturation-window"):
        await bs.saturation(None, {}, 1.0)


async def test_the_closed_loop_counts_steady_completions_and_cancels_the_rest(tiny_dirs):
    """On a tiny model: a positive rate, and the runs still going at the window's end
    are cancelled cleanly (nothing left running or held in the store)."""
    from corps.agents import Runtime

    from conftest import open_tiny

    async with open_tiny(tiny_dirs, "llama") as engine, Runtime(engine) as rt:
        rate = await bs.closed_loop(rt, TINY_MIX, concurrency=3, window_s=1.0)
        assert rate > 0
        # a cancelled workflow returns once its agents' calls are rolled back
        engine.check()
        s = engine.stats()
        assert s.queue_depth == 0 and s.tokens_used == 0 and s.messages == 0


def test_percentiles():
    assert bs.percentiles([]) == {}
    p = bs.percentiles([float(i) for i in range(101)])
    assert (p["p50"], p["p90"], p["p99"]) == (50.0, 90.0, 99.0)


async def test_every_policy_runs_the_same_arrivals_and_reports_a_cell(tiny_dirs, tmp_path):
    report = await bs.measure(
        str(tiny_dirs["llama"]), dtype="float32", loads=[0.5], duration=1.0, chat=1,
        policies=["fcfs", "workflow", "objective"], mix=TINY_MIX, saturation_window_s=1.0,
        concurrencies=(2, 4), trace_dir=tmp_path / "traces",
    )  # fmt: skip
    assert report.saturation_per_s > 0 and report.saturation_concurrency in (2, 4)
    assert [c.policy for c in report.cells] == ["idle", "fcfs", "workflow", "objective"]
    loaded = report.cells[1:]
    assert report.cells[0].workflows == 0 and report.cells[0].chat_ttft_s  # chat alone
    assert len({c.workflows for c in loaded}) == 1  # the same schedule for each
    # ... and the same work: float32 samples the same tokens in any batch
    assert len({c.tokens for c in loaded}) == 1 and loaded[0].tokens >= bs.CHAT_TOKENS
    for c in loaded:
        assert c.failed == 0 and c.wall_s > 0
        assert c.workflows == 0 or set(c.latency_s) == {"p50", "p90", "p99"}
        assert set(c.chat_ttft_s) == {"p50", "p90", "p99"}  # the chat stream ran
        assert c.workflows == 0 or set(c.slowdown) == {"p50", "p90", "p99"}
        assert 0 < c.busy <= 1
    assert set(report.alone_s) == {"0.5"}  # the floor of the one load
    from corps.engine.trace.reader import Trace

    policies = {"alone": "fcfs", "fcfs": "fcfs", "objective": "objective", "workflow": "workflow"}
    names = sorted(f.name for f in (tmp_path / "traces").iterdir())
    assert names == [f"load0.5-{p}.jsonl" for p in policies]
    for name, policy in zip(names, policies.values(), strict=True):  # each engine's own
        trace = Trace.load(tmp_path / "traces" / name)
        assert trace.steps and trace.closed and trace.header.policy == policy
    assert loaded[0].workflows == 0 or set(report.alone_s["0.5"]) == {"p50", "p90", "p99"}
    text = bsr.table(report), bsr.ratios(report)
    assert text


async def test_without_alone_there_is_no_floor_nor_slowdown(tiny_dirs):
    report = await bs.measure(
        str(tiny_dirs["llama"]), dtype="float32", loads=[0.5], duration=1.0,
        policies=["fcfs"], mix=TINY_MIX, saturation_window_s=1.0, concurrencies=(2,), alone=False,
    )  # fmt: skip
    assert report.alone_s == {} and all(c.slowdown == {} for c in report.cells)


def test_slowdowns_pair_each_workflow_with_itself_alone():
    latencies = {0: 2.0, 1: 9.0, 2: 4.0, 3: 5.0}
    floor = {0: 1.0, 1: 3.0, 2: 4.0}  # 3 failed alone: left out
    assert bs.slowdowns(latencies, floor) == [2.0, 3.0, 1.0]


def test_pooled_schedules_give_percentiles_over_every_workflow_and_summed_throughput():
    def one(lat, wall, failed=0, **kw):
        return bs.Cell(policy="fcfs", load=0.8, workflows=len(lat), failed=failed, wall_s=wall,
                       workflows_per_min=60 * (len(lat) - failed) / wall, tokens_per_s=10.0 * wall,
                       latency_s=bs.percentiles(lat), latencies=lat, busy=wall / 10,
                       max_queue=int(wall), mean_running=wall, **kw)  # fmt: skip

    a = one([1.0, 2.0, 9.0], wall=2.0, failed=1, slowdowns=[1.0, 2.0], tpots=[0.02], tokens=5)
    b = one([3.0, 4.0], wall=6.0, slowdowns=[1.5], tpots=[0.03, 0.04], tokens=7)
    assert bs.pool([a]) is a
    p = bs.pool([a, b])
    assert (p.workflows, p.failed, p.wall_s, p.schedules, p.tokens) == (5, 1, 8.0, 2, 12)
    assert p.workflows_per_min == 60 * 4 / 8.0  # completed over the summed wall time
    assert p.latencies == [1.0, 2.0, 9.0, 3.0, 4.0]
    assert p.latency_s == bs.percentiles([1.0, 2.0, 3.0, 4.0, 9.0])
    assert p.slowdown == bs.percentiles([1.0, 2.0, 1.5])
    assert p.chat_tpot_s == bs.percentiles([0.02, 0.03, 0.04])
    # per-second figures weighted by wall time: (20 * 2 + 60 * 6) / 8; busy (0.2 * 2 + 0.6 * 6) / 8
    assert p.tokens_per_s == (20.0 * 2 + 60.0 * 6) / 8 and p.busy == (0.2 * 2 + 0.6 * 6) / 8
    assert (p.max_queue, p.mean_running) == (6, (2.0 * 2 + 6.0 * 6) / 8)


async def test_several_schedules_per_load_run_and_pool(tiny_dirs, tmp_path):
    """Two schedules at one load, a given saturation (nothing measured): each policy's
    cell pools both (every workflow's latency kept), one trace per engine and schedule."""
    report = await bs.measure(
        str(tiny_dirs["llama"]), dtype="float32", loads=[1.0], duration=2.0,
        policies=["fcfs", "workflow:1"], mix=TINY_MIX, schedules=2, saturation_per_s=3.0,
        trace_dir=tmp_path,
    )  # fmt: skip
    assert report.saturation_per_s == 3.0 and report.schedules == 2
    assert report.saturation_concurrency == 0  # given, not measured
    first, second = (bs.schedule(3.0, 2.0, list(TINY_MIX), seed) for seed in (0, 1))
    for c in report.cells:
        assert c.schedules == 2 and c.workflows == len(first) + len(second)
        assert len(c.latencies) == c.workflows and len(c.slowdowns) <= c.workflows
    names = sorted(f.name for f in tmp_path.iterdir())
    policies = ("alone", "fcfs", "workflow-max1")  # workflow:1: its engine lets one run in
    assert names == [f"load1-{p}-s{r}.jsonl" for p in policies for r in (0, 1)]


def test_a_policy_may_carry_a_cap_on_workflows_in_flight():
    assert bs.engine_settings("fcfs") == {"policy": "fcfs"}
    assert bs.engine_settings(" workflow:8") == {"policy": "workflow", "max_workflows": 8}
    for bad, says in (("lifo", "unknown policy 'lifo'"), ("lifo:2", "unknown policy"),
                      ("workflow:0", "whole number >= 1"), ("workflow:x", "whole number"),
                      ("workflow:-1", "whole number")):  # fmt: skip
        with pytest.raises(ValueError, match=says):
            bs.engine_settings(bad)


def test_bad_options_exit_2_before_anything_loads():
    runner = CliRunner()
    for args in (["--load", "x"], ["--load", "0"], ["--policies", "lifo"], ["--mix", "nope"],
                 ["--schedules", "0"], ["--saturation", "0"], ["--policies", "workflow:0"],
                 ["--policies", ","]):  # fmt: skip
        result = runner.invoke(app, ["bench", "serve", *args])
        assert result.exit_code == 2, (args, result.output)
        assert "Traceback" not in result.output


def test_a_mix_by_names_or_from_a_file(tmp_path):
    import pytest

    from corps.cache.errors import InvalidRequest

    assert bsm.load_mix("multi-qa, debate") == {"multi_qa": bsm.MIX["multi_qa"],
                                               "debate": bsm.MIX["debate"]}  # fmt: skip
    assert bsm.load_mix("map-reduce") == {"map_reduce": {}}  # not in MIX: its defaults
    js = tmp_path / "mix.json"
    js.write_text('{"map-reduce": {"chunk_tokens": 64}, "debate": {"rounds": 1}}')
    assert bsm.load_mix(str(js)) == {"map_reduce": {"chunk_tokens": 64}, "debate": {"rounds": 1}}
    toml = tmp_path / "mix.toml"
    toml.write_text("[multi_qa]\nmax_tokens = 8\n")
    assert bsm.load_mix(str(toml)) == {"multi_qa": {"max_tokens": 8}}
    bad = tmp_path / "bad.json"
    for text, says in (('{"debate": {"rounds": "many"}}', "rounds"), ("[1]", "must map"),
                       ("{", "not valid json"), ('{"nope": {}}', "no pattern named")):  # fmt: skip
        bad.write_text(text)
        with pytest.raises(InvalidRequest, match=says):
            bsm.load_mix(str(bad))
    with pytest.raises(InvalidRequest, match="no file"):
        bsm.load_mix(str(tmp_path / "missing.toml"))


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
    console.print(bsr.ratios(report))
    console.print(bsr.table(report))
    out = console.export_text()
    assert "0.50x" in out  # 0.75 / 1.5
    assert "alone" in out and "0.75" in out


def test_the_ratios_say_when_a_policy_sampled_other_tokens():
    from rich.console import Console

    report = _report(0)
    for c in report.cells:
        c.tokens = 400 if c.policy == "fcfs" else 436  # the same schedule, other tokens
    console = Console(width=200, record=True)
    console.print(bsr.ratios(report))
    out = console.export_text()
    assert "tokens / fcfs" in out and out.count("1.09x") == 2  # 436 / 400, at each load


def test_the_plot_is_a_png_with_a_line_per_policy(tmp_path):
    for chat in (0, 2):
        out = tmp_path / f"serve{chat}.png"
        report = _report(chat)
        if chat:  # with the floor line too
            report.alone_s = {"0.5": {"p99": 1.0}, "1": {"p99": 1.2}}
        bsr.plot(report, str(out))
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


async def test_the_idle_chats_run_in_every_round_and_pool_into_one_row(tiny_dirs):
    """With two schedules, the chats run idle twice (before each round's policies),
    pooled into the one idle row: a reference taken once would drift from the cells."""
    report = await bs.measure(
        str(tiny_dirs["llama"]), dtype="float32", loads=[0.5], duration=1.0, chat=1,
        policies=["fcfs"], mix=TINY_MIX, saturation_window_s=1.0, concurrencies=(2,),
        alone=False, schedules=2,
    )  # fmt: skip
    assert [c.policy for c in report.cells] == ["idle", "fcfs"]
    idle, fcfs = report.cells
    assert idle.schedules == 2 and len(idle.tpots) == 2 and idle.workflows == 0
    assert fcfs.schedules == 2
