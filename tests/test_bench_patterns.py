"""`corps bench patterns` (corps.bench.patterns): every pattern in each mode with its
defaults. Structure, the counts it reads off the handles, and its refusals of bad
options; never time."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from corps.bench import patterns as bp
from corps.cli.app import app

runner = CliRunner()
pytestmark = pytest.mark.filterwarnings("ignore::corps.cache.visibility.LeakWarning")


async def test_each_configuration_runs_each_pattern_with_its_own_decisions(tiny_dirs):
    configs = ["baseline", "choreographed", "unrepaired", "unbounded"]
    report = await bp.measure(
        ["tree_of_thoughts", "debate"], [4], model=str(tiny_dirs["llama"]), configs=configs
    )
    assert [(r.pattern, r.config) for r in report.runs] == [
        (p, c) for p in ("tree_of_thoughts", "debate") for c in configs
    ]
    runs = {(r.pattern, r.config): r for r in report.runs}
    tot = {c: runs[("tree_of_thoughts", c)] for c in configs}
    assert tot["baseline"].repaired == tot["unrepaired"].repaired == 0
    assert tot["unbounded"].cut == 0  # nothing caps it
    for r in report.runs:
        assert r.calls > 0 and 0 < r.generated < r.encoded and r.wall_s > 0
        assert r.repaired <= r.encoded - r.generated
    table = bp.table(report)
    assert table.row_count == 2 and len(table.columns) == 2 + 2 * len(configs) + 3


async def test_equal_work_makes_the_same_calls_on_the_baseline_tokens(tiny_dirs):
    configs = ["choreographed", "baseline", "unrepaired"]  # the baseline still runs first
    report = await bp.measure(["debate", "multi_qa"], [4], model=str(tiny_dirs["llama"]),
                              configs=configs, equal_work=True)  # fmt: skip
    assert report.equal_work
    for pattern in ("debate", "multi_qa"):
        runs = [r for r in report.runs if r.pattern == pattern]
        assert [r.config for r in runs] == ["baseline", "choreographed", "unrepaired"]
        base, *others = runs
        assert base.over is None
        for r in others:  # same tokens: same calls, same tokens sampled
            assert (r.calls, r.generated) == (base.calls, base.generated)
            assert r.over is not None and 0 <= r.over <= r.calls
    multi = {r.config: r for r in report.runs if r.pattern == "multi_qa"}
    # one final decode over prefilled questions, no repair: as much as the baseline
    assert multi["unrepaired"].encoded == multi["baseline"].encoded
    assert "over" in bp.table(report).columns[2].header
    with pytest.raises(ValueError, match="include baseline"):
        await bp.measure(["debate"], [4], model=str(tiny_dirs["llama"]),
                         configs=["choreographed"], equal_work=True)  # fmt: skip


def test_over_counts_turns_that_encoded_more_than_the_baselines_same_turn():
    from corps.patterns.replay import Replay, TurnScores

    def turns(*encoded):
        r = Replay(figures=True)
        r.scores = {i: TurnScores("a", (), (), (), encoded=e) for i, e in enumerate(encoded, 1)}
        return r

    assert bp.over(turns(5, 5, 5), turns(4, 5, 6)) == 1
    assert bp.over(turns(5), turns(9, 9)) == 1  # a turn the baseline did not make: not compared


@pytest.mark.parametrize(
    "args, says",
    [
        (["--equal-work", "--configs", "choreographed"], "include baseline"),
        (["--configs", "baseline,nope"], "--configs"),
        (["--configs", ""], "--configs"),
        (["--max-tokens", "12,x"], "--max-tokens"),
        (["--max-tokens", "0"], "--max-tokens"),
        (["--patterns", "no-such-pattern"], "no pattern named"),
    ],
)
def test_bad_options_are_refused_in_one_line_before_a_model_loads(args, says):
    result = runner.invoke(app, ["bench", "patterns", *args])
    assert result.exit_code == 2 and says in result.output
    assert "Traceback" not in result.output


def test_the_cli_prints_the_table_and_writes_the_runs(tiny_dirs, tmp_path):
    out = tmp_path / "runs.json"
    result = runner.invoke(app, [
        "bench", "patterns", "--patterns", "multi-qa", "--max-tokens", "3",
        "--configs", "baseline,choreographed", "--model", str(tiny_dirs["llama"]),
        "--json", str(out),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "multi-qa" in result.output and "chor / base" in result.output
    runs = json.loads(out.read_text())["runs"]
    assert [r["config"] for r in runs] == ["baseline", "choreographed"]
