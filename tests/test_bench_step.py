"""`corps bench step` (corps.bench.step): the host's share of a decode step, on a
tiny model. Never asserts on time, only on how the figures relate."""

from __future__ import annotations

import anyio
import pytest
from typer.testing import CliRunner

from corps.bench import step as bs
from corps.cli.app import app


def test_each_count_decodes_its_tokens_in_one_step_a_token(tiny_dirs):
    figures = anyio.run(
        lambda: bs.measure(
            str(tiny_dirs["llama"]),
            streams=(1, 3),
            tokens=5,
            rounds=2,
            run_aheads=(1, 4),
            dtype="float32",
        )
    )
    assert [(f.run_ahead, f.streams) for f in figures] == [(1, 1), (1, 3), (4, 1), (4, 3)]
    for f in figures:
        assert f.wall_ms >= f.step_ms  # the caller waits for the steps and the loop
        # the first step encodes the role headers and samples each stream's first
        # token, each next one encodes a token and samples one, the last encodes the
        # last token with the footer that closes the turn
        assert f.steps == 5 + 1
        assert f.step_ms > 0 and 0 < f.forward_ms <= f.step_ms
        assert f.host_ms == pytest.approx(f.step_ms - f.forward_ms)
        assert 0 <= f.host_share < 1


def test_the_median_is_a_round_that_ran():
    rounds = [bs.StepFigures(4, 9, 3.0, 1.0, h) for h in (2.0, 0.5, 1.0)]
    assert bs._median(rounds).host_ms == 1.0


def test_calls_may_keep_their_logprobs(tiny_dirs):
    figures = anyio.run(
        lambda: bs.measure(
            str(tiny_dirs["llama"]), streams=(2,), tokens=4, rounds=1, top_logprobs=3,
            dtype="float32",
        )
    )  # fmt: skip
    assert figures[0].steps == 4 + 1 and figures[0].host_ms > 0


@pytest.mark.parametrize("top", ["-1", "21", "x"])
def test_bad_top_logprobs_exit_2(top):
    result = CliRunner().invoke(app, ["bench", "step", "--top-logprobs", top])
    assert result.exit_code == 2 and "--top-logprobs" in result.output


@pytest.mark.parametrize("option", ["--streams", "--run-ahead"])
@pytest.mark.parametrize("counts", ["x", "0", "", "1,-2", "9" * 40])
def test_bad_counts_exit_2_before_anything_loads(option, counts):
    result = CliRunner().invoke(app, ["bench", "step", option, counts])
    assert result.exit_code == 2 and option in result.output


def test_the_table_compares_each_setting_with_a_hop_per_step():
    figures = [bs.StepFigures(16, 9, 3.0, 2.0, h, 3.5, a) for a, h in ((1, 1.0), (8, 0.5))]
    text = str(bs.table(figures, "t").columns[-1]._cells)
    assert "1.00x" in text and "0.50x" in text
