"""bench/kernels.py: `corps bench kernels` skips cleanly without CUDA, refuses the CPU
without the interpreter, and its timing code runs end to end under the interpreter."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from corps.cli.app import app

runner = CliRunner()


def test_without_cuda_it_says_so_and_exits_0(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = runner.invoke(app, ["bench", "kernels"])
    assert result.exit_code == 0, result.output
    assert "no CUDA device" in result.output and "skipped" in result.output


def test_cpu_needs_the_interpreter(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    result = runner.invoke(app, ["bench", "kernels", "--device", "cpu"])
    assert result.exit_code == 2 and "TRITON_INTERPRET=1" in result.output


def test_timing_code_runs_under_the_interpreter():
    pytest.importorskip("triton")
    from corps.bench.kernels import measure, table

    timings = measure("cpu", small=True, repeats=1)
    assert [t.kernel for t in timings] == ["gather_rotate", "decode_attention", "flex_prefill"]
    assert all(t.ours_ms > 0 and t.reference_ms > 0 and t.sdpa_ms > 0 for t in timings)
    assert table(timings, "cpu").row_count == 3


def test_cpu_prints_the_measured_product_kernels_and_caches_them(tiny_dirs, tmp_path, monkeypatch):
    monkeypatch.setenv("CORPS_HOME", str(tmp_path))
    args = ["bench", "kernels", "--cpu", "--model", str(tiny_dirs["llama"])]
    first = runner.invoke(app, args, terminal_width=160)
    assert first.exit_code == 0, first.output
    assert "auto picks" in first.output and "float32 picks" in first.output
    assert "timed now" in first.output and list((tmp_path / "kernels").glob("*.json"))
    again = runner.invoke(app, args, terminal_width=160)
    assert again.exit_code == 0 and "timed now" not in again.output  # read from the cache
    fresh = runner.invoke(app, [*args, "--remeasure"], terminal_width=160)
    assert fresh.exit_code == 0 and "timed now" in fresh.output
