"""`corps bench runner` (corps.bench.runner): its alternation and table, on a tiny
model. Never time."""

from __future__ import annotations

from typer.testing import CliRunner

from corps.bench import runner as br
from corps.cli.app import app


def test_best_of_runs_every_probe_once_per_round_in_turn():
    calls: list[str] = []
    probes = {name: (lambda n=name: calls.append(n)) for name in ("ours", "hf")}
    best = br.best_of(probes, 3)
    assert calls == ["ours", "hf"] * 3
    assert set(best) == {"ours", "hf"} and all(t >= 0 for t in best.values())


def test_rates_cancel_the_one_token_run():
    t = dict(decode_n=2.0, decode_1=0.5, prefill=0.25)
    assert br.rates(t, 16, 64) == (15 / 1.5, 256.0)


def test_the_command_measures_ours_and_hf_side_by_side(tiny_dirs):
    args = ["bench", "runner", "-m", str(tiny_dirs["llama"]), "--dtypes", "float32"]
    args += ["--decode-tokens", "8", "--prefill-tokens", "8", "--repeats", "1"]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for row in ("decode (8 tok)", "prefill (8 tok)", "decode bound: weights only"):
        assert row in result.output


def test_compile_adds_the_captured_step_measured_in_the_same_rounds(tiny_dirs):
    args = ["bench", "runner", "-m", str(tiny_dirs["llama"]), "--dtypes", "float32"]
    args += ["--decode-tokens", "8", "--prefill-tokens", "8", "--repeats", "1", "--compile"]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "decode (8 tok), compiled step (library gemms)" in result.output
    assert "float32: decode compiled step (library gemms) at" in result.output
    assert "decode bound: weights only, in a graph (library gemms)" in result.output
    assert "s when the engine opened" in result.output  # what the compile cost


def test_an_unknown_compile_gemms_is_one_line(tiny_dirs):
    args = ["bench", "runner", "-m", str(tiny_dirs["llama"]), "--compile"]
    result = CliRunner().invoke(app, [*args, "--compile-gemms", "library,fastest"])
    assert result.exit_code == 2 and "--compile-gemms" in result.output
