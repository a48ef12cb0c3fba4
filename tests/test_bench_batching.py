"""`corps bench batching` (corps.bench.batching): its rounds and table, on a tiny
model. Never time."""

from __future__ import annotations

import anyio
from typer.testing import CliRunner

from corps.bench import batching as bb
from corps.cli.app import app


def test_rounds_run_every_count_each_round_and_ratios_pair_rounds(tiny_dirs):
    rows, _ = anyio.run(bb._measure, str(tiny_dirs["llama"]), "float32", [1, 3], 3, 2)
    assert [r.streams for r in rows] == [1, 3]
    for row in rows:
        assert len(row.together) == len(row.overhead) == 2  # one per round
        assert all(t > 0 for t in row.together) and row.alone > 0
    assert rows[0].ratios(rows[0]) == [1.0, 1.0]
    got = rows[1].ratios(rows[0])
    assert got == [t / b for t, b in zip(rows[1].together, rows[0].together, strict=True)]


def test_the_command_prints_medians_and_ranges(tiny_dirs, monkeypatch):
    # HF's side is bench runner's (it prefills random ids of the real vocabulary)
    monkeypatch.setattr(bb, "measure_hf", lambda *a: (1.0, 1.0))
    args = ["bench", "batching", "-m", str(tiny_dirs["llama"]), "--streams", "1,2"]
    result = CliRunner().invoke(
        app, [*args, "--tokens", "3", "--rounds", "2"], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    assert "median of 2 round(s)" in result.output and "1.00x [1.00, 1.00]" in result.output


def test_bad_stream_counts_exit_2():
    for bad in ("1,x", "0,4", ","):
        result = CliRunner().invoke(app, ["bench", "batching", "--streams", bad])
        assert result.exit_code == 2 and "--streams" in result.output
