"""The `corps` command line (corps.cli.app)."""

from __future__ import annotations

from typer.testing import CliRunner

from corps.cli.app import app

runner = CliRunner()


def test_models_lists_the_default_alias(tmp_path, monkeypatch):
    monkeypatch.setenv("CORPS_HOME", str(tmp_path))
    result = runner.invoke(app, ["models"])
    assert result.exit_code == 0 and "smollm2-135m" in result.output


def test_chat_errors_are_one_line(tmp_path):
    result = runner.invoke(app, ["chat", "hi", "--model", str(tmp_path / "missing")])
    assert result.exit_code == 1
    assert "error:" in result.output and "Traceback" not in result.output


async def _greedy_answer(path, question: str, n: int) -> str:
    from corps.engine import Engine

    async with Engine.open(str(path), capacity=4096) as engine:
        q = await engine.prefill(question)
        return (await engine.decode(parents=[q], max_tokens=n)).text


def test_chat_streams_the_models_answer(tiny_dirs):
    import anyio

    want = anyio.run(_greedy_answer, tiny_dirs["llama"], "hello world", 5)
    result = runner.invoke(
        app, ["chat", "hello world", "--model", str(tiny_dirs["llama"]), "--max-tokens", "5"]
    )
    assert result.exit_code == 0, result.output
    assert want and result.output == want + "\n"
