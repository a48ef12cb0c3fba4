"""cli/bench_kernels.py: `corps bench kernels` skips cleanly without CUDA, refuses the CPU
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
    from corps.cli.bench_kernels import measure, table

    timings = measure("cpu", small=True, repeats=1)
    assert [t.kernel for t in timings] == ["gather_rotate", "decode_attention", "flex_prefill"]
    assert all(t.ours_ms > 0 and t.reference_ms > 0 and t.sdpa_ms > 0 for t in timings)
    assert table(timings, "cpu").row_count == 3
