"""`corps bench vs-llamacpp` (corps.bench.llamacpp): the corps side, and a clear
message without llama-cpp-python. Never time."""

from __future__ import annotations

import sys

import pytest
from typer.testing import CliRunner

from corps.bench import llamacpp as bl
from corps.cli.app import app

from conftest import open_tiny


async def test_the_corps_workflow_decodes_the_fixed_counts_and_frees_everything(tiny_dirs):
    for mode in ("choreographed", "baseline"):
        async with open_tiny(tiny_dirs, "llama", mode=mode) as engine:
            used = engine.stats().tokens_used
            wall = await bl.corps_workflow(engine, "What is 2+2?", branches=3, voters=2)
            assert wall > 0 and engine.stats().messages == 0
            if mode == "choreographed":  # (baseline keeps its prefix cache)
                assert engine.stats().tokens_used == used


def test_without_llama_cpp_it_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import fails
    with pytest.raises(bl.MissingLlamaCpp, match=r"corps\[llamacpp\]"):
        bl.load_llama("model.gguf")
    result = CliRunner().invoke(app, ["bench", "vs-llamacpp", "--cells", "2x2"])
    assert result.exit_code == 2 and "pip install 'corps[llamacpp]'" in result.output


def test_bad_cells_exit_2():
    result = CliRunner().invoke(app, ["bench", "vs-llamacpp", "--cells", "4by4"])
    assert result.exit_code == 2 and "BxV" in result.output


def test_the_llama_process_reports_a_child_failure_and_exits(tmp_path):
    """llama.cpp runs in a child process; a failure there (no llama-cpp-python, or a
    bad model file) is raised in the parent with its cause, and the child is gone."""
    with pytest.raises(RuntimeError, match=r"llama\.cpp failed: .*"):
        bl.LlamaProcess(str(tmp_path / "missing.gguf"), str(tmp_path), threads=1)


async def test_the_corps_stream_decodes_the_fixed_count_and_frees_everything(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine:
        wall, text = await bl.corps_stream(engine, "Tell me a story.", 12)
        assert wall > 0 and text and engine.stats().messages == 0


def test_the_stream_table_names_each_format_and_its_ratio():
    from rich.console import Console

    stream = bl.Stream(
        tokens=128,
        rates={"llama.cpp": [100.0, 110.0], "corps": [80.0, 88.0], "corps dense": [50.0, 55.0]},
        texts={"llama.cpp": "Once upon a time", "corps": "Once upon a tide", "corps dense": "One"},
    )
    console = Console(width=120, record=True)
    console.print(bl.stream_table(stream, "auto"))
    text = console.export_text()
    assert "weights=auto" in text and "weights=dense" in text
    assert "0.80x" in text and "0.50x" in text  # best of runs over llama.cpp's best
    assert "first 14 of 16 chars" in text and "first 2 of 16 chars" in text


def test_bad_weights_exit_2():
    result = CliRunner().invoke(app, ["bench", "vs-llamacpp", "--weights", "int3"])
    assert result.exit_code == 2 and "weights must be one of" in result.output
