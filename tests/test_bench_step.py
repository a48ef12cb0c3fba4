"""`corps bench step` (corps.cli.bench.step): the host's share of a decode step, on a
tiny model. Never asserts on time, only on how the figures relate."""

from __future__ import annotations

import anyio
import pytest
from typer.testing import CliRunner

from corps.cli.app import app
from corps.cli.bench import step as bs


def test_each_count_decodes_its_tokens_in_one_step_a_token(tiny_dirs):
    figures = anyio.run(
        lambda: bs.measure(
            str(tiny_dirs["llama"]), streams=(1, 3), tokens=5, rounds=2, dtype="float32"
        )
    )
    assert [f.streams for f in figures] == [1, 3]
    for f in figures:
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


@pytest.mark.parametrize("streams", ["x", "0", "", "1,-2"])
def test_bad_stream_counts_exit_2_before_anything_loads(streams):
    result = CliRunner().invoke(app, ["bench", "step", "--streams", streams])
    assert result.exit_code == 2 and "--streams" in result.output
