"""`corps bench account` (bench/account.py): each pattern's per-phase account in both
modes on equal work, a table per pattern and a JSON line per pattern and mode, and
bad options refused before anything loads. Structure only: no timing is asserted."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from corps.bench.account import ModeAccount
from corps.cli.app import app


def invoke(tiny_dirs, *args):
    model = str(tiny_dirs["llama"])
    return CliRunner().invoke(
        app, ["bench", "account", "-m", model, "--dtype", "float32", "--device", "cpu",
              "--max-tokens", "3", *args], env={"COLUMNS": "200"},
    )  # fmt: skip


def test_each_pattern_in_both_modes_on_equal_work(tiny_dirs, tmp_path):
    out = tmp_path / "account.jsonl"
    result = invoke(tiny_dirs, "--patterns", "debate,tree-of-thoughts", "--out", str(out))
    assert result.exit_code == 0, result.output
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(r["pattern"], r["mode"]) for r in rows] == [
        ("debate", "baseline"), ("debate", "choreographed"),
        ("tree_of_thoughts", "baseline"), ("tree_of_thoughts", "choreographed"),
    ]  # fmt: skip
    for base, chor in zip(rows[::2], rows[1::2], strict=True):
        assert base["calls"] == chor["calls"] > 0  # the same turns (the tokens replayed)
    for r in rows:
        assert r["section"] == "account" and r["device_s"] == {} and r["kernels"] == {}
        assert r["entries"]["decode"] > 0 and r["launches"]["decode"] > 0
        assert set(r["host_s"]) <= set(r["entries"])
        assert r["first_wall_s"] > 0 and r["wall_s"] > 0
    assert "debate: where the time goes" in result.output
    assert "tree_of_thoughts: where the time goes" in result.output


def test_without_the_counted_run_no_launches(tiny_dirs):
    result = invoke(tiny_dirs, "--patterns", "debate", "--count", "none")
    assert result.exit_code == 0, result.output


def test_outside_is_what_no_phase_holds():
    row = ModeAccount("debate", "baseline", "cpu", wall_s=1.0, ttft_s=0.1, calls=2, encoded=9,
                      host_s={"decode": 0.5, "sample": 0.25})  # fmt: skip
    assert row.outside_s == pytest.approx(0.25)
    row.device_s = {"decode": 0.6}  # on CUDA the device's time counts
    assert row.outside_s == pytest.approx(0.4)


@pytest.mark.parametrize(
    "args, says",
    [(["--patterns", "debate,chess"], "unknown chess"), (["--patterns", ","], "none given"),
     (["--max-tokens", "0"], "max-tokens"), (["--dtype", "int3"], "dtype"),
     (["--count", "all"], "--count")],
)  # fmt: skip
def test_bad_options_are_refused_before_anything_loads(tiny_dirs, args, says):
    result = invoke(tiny_dirs, *args)
    assert result.exit_code == 2 and says in result.output, result.output


def test_a_failed_counted_run_keeps_the_timed_figures_and_fails_the_command(
    tiny_dirs, tmp_path, monkeypatch
):
    from corps.bench import account

    async def broken(self):
        raise RuntimeError("the counter broke")

    monkeypatch.setattr(account._Counted, "__aenter__", broken)
    out = tmp_path / "account.jsonl"
    result = invoke(tiny_dirs, "--patterns", "debate", "--out", str(out))
    assert result.exit_code == 1 and "the counter broke" in result.output
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["mode"] for r in rows] == ["baseline", "choreographed"]
    for r in rows:
        assert "the counter broke" in r["count_error"] and r["launches"] == {}
        assert r["entries"]["decode"] > 0 and r["wall_s"] > 0  # the timed run stands
