"""`corps bench workflow` (corps.bench.workflow) and the replay it relies on.

Structure and equal work only: these tests never assert on time."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from corps.bench import workflow as bw
from corps.cli.app import app
from corps.patterns.replay import Replay, ReplayMismatch

runner = CliRunner()
pytestmark = pytest.mark.filterwarnings("ignore::corps.cache.visibility.LeakWarning")
SMALL = {"max_tokens": 5, "seed": 2}


@pytest.mark.parametrize(
    "pattern, params",
    [
        ("tree_of_thoughts", {"branches": 3, "voters": 2}),
        ("parallel_debate", {"agents": 2, "rounds": 2}),
        ("debate", {"rounds": 2}),
        ("prisoners_dilemma", {"rounds": 1}),
    ],
)
async def test_every_implementation_decodes_the_same_tokens(tiny_dirs, pattern, params):
    report = await bw.measure(
        pattern, {**SMALL, **params}, model=str(tiny_dirs["llama"]), runs=1, warmup=0
    )
    (run,) = report.runs
    assert list(run) == ["baseline", "choreographed", "hf"] and report.equal_work
    base, chor, hf = run["baseline"], run["choreographed"], run["hf"]
    assert base.tokens == chor.tokens == hf.tokens and base.decoded == chor.decoded > 0
    assert base.calls == chor.calls == hf.calls == len(base.tokens)
    assert hf.reused == 0 and chor.reused > 0
    assert chor.prefilled < hf.prefilled  # hf re-encodes every prompt from scratch
    assert set(report.ratios) == {"baseline/choreographed", "hf/choreographed"}
    assert all(r.low <= r.mean <= r.high for by in report.ratios.values() for r in by.values())
    assert 0 < base.encode_s < base.wall_s and 0 < chor.encode_s < chor.wall_s
    assert report.ceiling > 1


def test_ceiling_is_the_baseline_without_its_encoding_steps():
    def run(wall: float, encode: float) -> dict[str, bw.Sample]:
        s = bw.Sample(ttft_s=0, wall_s=wall, calls=1, prefilled=1, reused=0, decoded=1, tokens=[])
        return {"baseline": s.model_copy(update={"encode_s": encode}), "choreographed": s}

    assert bw.ceiling([run(10.0, 5.0), run(6.0, 1.0)]) == pytest.approx(8.0 / 5.0)
    assert bw.ceiling([run(1.0, 1.0)]) == float("inf")


def test_bootstrap_brackets_the_ratio_of_means():
    flat = bw.bootstrap([2.0, 4.0, 6.0], [1.0, 2.0, 3.0])
    assert flat.mean == flat.low == flat.high == pytest.approx(2.0)
    spread = bw.bootstrap([1.0, 3.0, 2.0, 6.0], [1.0, 1.0, 1.0, 1.0])
    assert spread.mean == pytest.approx(3.0) and spread.low < 3.0 < spread.high


def test_a_replay_that_meets_an_unrecorded_turn_says_so():
    replay = Replay()
    replay.record(1, SimpleNamespace(generated=[5, 6]))
    forced = replay.forcing()
    assert forced.force(1) == (5, 6) and replay.force(1) is None
    with pytest.raises(ReplayMismatch, match="turn 2"):
        forced.force(2)


def test_cli_reports_and_writes_json(tiny_dirs, tmp_path):
    out = tmp_path / "r.json"
    args = ["bench", "workflow", "multi-qa", "--set", "max_tokens=3", "--runs", "1"]
    args += ["--warmup", "0", "--model", str(tiny_dirs["llama"]), "--json", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "speedup of choreographed" in result.output and "equal work yes" in result.output
    (report,) = json.loads(out.read_text())
    assert report["pattern"] == "multi-qa" and report["equal_work"] is True


@pytest.mark.parametrize(
    "args",
    [["nope"], ["debate", "--impls", "hf"], ["debate", "--set", "rounds=zero"]],
)
def test_cli_bad_input_exits_2(args):
    result = runner.invoke(app, ["bench", "workflow", *args])
    assert result.exit_code == 2 and "error" in result.output


def test_workflows_runs_the_paper_settings_and_the_sweep(tiny_dirs, tmp_path):
    out = tmp_path / "all.json"
    args = ["bench", "workflows", "--runs", "1", "--warmup", "0", "--sweep", "2,3"]
    args += ["--max-tokens", "3", "--model", str(tiny_dirs["llama"]), "--json", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    reports = json.loads(out.read_text())
    names = [r["pattern"] for r in reports]
    assert names == ["debate", "tree_of_thoughts", "parallel_debate"] + ["tree_of_thoughts"] * 4
    assert all(r["equal_work"] for r in reports)
    assert result.output.count("tree of thoughts sweep") == 3  # end to end, TTFT, ceiling
    assert "end-to-end ceiling" in result.output
    assert all(r["ceiling"] > 1 for r in reports)
    assert list(reports[-1]["runs"][0]) == ["baseline", "choreographed"]  # the sweep's pair
