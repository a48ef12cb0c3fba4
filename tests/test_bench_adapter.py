"""`corps bench adapter` (corps.bench.adapter): its structure on a tiny model, never time."""

from __future__ import annotations

from typer.testing import CliRunner

from corps.cli.app import app
from corps.engine.model.adapter_files import trainable, write_scope

from helpers import hf_model


def _bench(tiny_dirs, tmp_path, scope: str = "all"):
    """`corps bench adapter` on a fresh adapter of `scope`, tiny sizes, wide output."""
    trainable(hf_model(tiny_dirs["llama"]), rank=2, alpha=4).save_pretrained(str(tmp_path / "a"))
    write_scope(tmp_path / "a", scope)
    r = CliRunner(env={"COLUMNS": "200"}).invoke(
        app,
        ["bench", "adapter", str(tmp_path / "a"), "--model", str(tiny_dirs["llama"]),
         "--dtype", "float32", "--decode-tokens", "8", "--prefill-tokens", "16",
         "--repeats", "1"],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    return r


def test_the_bench_prints_base_and_adapter_side_by_side(tiny_dirs, tmp_path):
    r = _bench(tiny_dirs, tmp_path)
    assert "merged adapter vs base" in r.output and "adapter / base" in r.output
    assert "no copy" not in r.output
    assert "decode (8 tok)" in r.output and "prefill (16 tok)" in r.output


def test_an_adapter_kept_apart_is_timed_on_chain_and_rewired_calls(tiny_dirs, tmp_path):
    r = _bench(tiny_dirs, tmp_path, "rewired")
    assert "adapter kept apart (scope rewired) vs base" in r.output
    for row in ("decode (8 tok, chain calls)", "prefill (16 tok, rewired calls)"):
        assert row in r.output
    assert "no copy / base" in r.output


def test_a_missing_adapter_is_one_line(tiny_dirs, tmp_path):
    r = CliRunner().invoke(
        app, ["bench", "adapter", str(tmp_path / "no"), "--model", str(tiny_dirs["llama"])]
    )
    assert r.exit_code == 2 and "not a directory" in r.output
