"""`corps bench http` (bench/http.py): both paths on a tiny model, structure only
(nothing here asserts on a timing)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from corps.bench import http as bench_http
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


def test_a_workflow_by_id_reads_more_from_the_store_than_text_resent(tiny_dirs):
    """Structure, and what holds whatever the tiny model samples: by id, the votes read
    the question and the proposals' encodings from the store. (Tokens encoded fall too
    on the real model, docs/serve.md; here the replies are a few tokens either way.)"""
    cfg = EngineConfig.of(str(tiny_dirs["llama"]), dtype="float32", capacity=4096)
    plain, by_id = (bench_http.flow(cfg, "tiny", b, branches=3, voters=2, tokens=6)
                    for b in (False, True))  # fmt: skip
    assert plain.variant.startswith("plain") and by_id.variant.startswith("by id")
    assert len(plain.ttft_s) == len(by_id.ttft_s) == 5
    assert by_id.tokens_encoded > 0 and plain.tokens_encoded > 0
    assert by_id.tokens_reused > plain.tokens_reused


def test_constrained_json_and_tool_calls_always_parse(tiny_dirs):
    cfg = EngineConfig.of(str(tiny_dirs["llama"]), dtype="float32", capacity=4096)
    counts = bench_http.structured(cfg, "tiny", requests=3, tokens=96)
    assert counts["json constrained"] == (0, 3)
    for kind in ("tool required", "tool required, streamed", "tool auto", "tool auto, streamed"):
        assert counts[kind] == (0, 3), kind
    assert set(counts) == {"json constrained", "json free", "tool required",
                           "tool required, streamed", "tool auto", "tool auto, streamed",
                           "tool free (asked in words)"}  # fmt: skip


def test_the_checks_of_a_reply():
    from types import SimpleNamespace as NS

    assert bench_http.is_person('{"name": "Ada", "age": 36}')
    assert not bench_http.is_person('{"name": "Ada"}') and not bench_http.is_person("Ada, 36")
    assert not bench_http.is_person('{"name": "Ada", "age": true}')
    call = NS(function=NS(name="get_weather", arguments='{"city": "Oslo"}'))
    assert bench_http.is_weather_call(NS(tool_calls=[call]))
    assert not bench_http.is_weather_call(NS(tool_calls=None))
    bad = NS(function=NS(name="get_weather", arguments="{city"))
    assert not bench_http.is_weather_call(NS(tool_calls=[bad]))
    assert not bench_http.broken_call(NS(content="It is sunny", tool_calls=None))
    assert bench_http.broken_call(NS(content='{"name": "get_weather", "argu', tool_calls=None))
    assert bench_http.broken_call(NS(content=None, tool_calls=[bad]))
