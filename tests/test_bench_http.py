"""`corps bench http` (cli/bench_http.py): both paths on a tiny model, structure only
(nothing here asserts on a timing)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from corps.cli import bench_http
from corps.cli.app import app
from corps.engine.config import EngineConfig


def test_both_paths_serve_every_request(tiny_dirs):
    cfg = EngineConfig.of(str(tiny_dirs["llama"]), dtype="float32", capacity=4096)
    cells = bench_http.measure(cfg, "tiny", clients=3, requests=2, tokens=4, rounds=1)
    for path in ("python", "http"):
        (cell,) = cells[path]
        assert cell.requests == 6 and len(cell.latencies) == 6
        assert 6 <= cell.tokens <= 24 and cell.seconds > 0
        assert cell.pct(0.5) <= cell.pct(0.99)


def test_the_command_prints_the_table(tiny_dirs):
    result = CliRunner().invoke(
        app,
        ["bench", "http", "-m", str(tiny_dirs["llama"]), "--dtype", "float32", "--clients",
         "2", "--requests", "1", "--tokens", "3", "--rounds", "1"],
        env={"COLUMNS": "200"},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "python" in result.output and "http" in result.output and "vs python" in result.output
