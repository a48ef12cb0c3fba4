"""docs/ and mkdocs.yml: the documentation builds in strict mode (a broken link or
API reference fails it), the README stays a short front page, and every Python
snippet of README.md and docs/ runs as written (on a tiny model)."""

from __future__ import annotations

import inspect
import re
import shutil
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

ROOT = Path(__file__).resolve().parent.parent
#: A ```python block, and the stated reason before it when it is not run.
SNIPPET = re.compile(
    r"(?:<!-- snippet not run: (?P<why>[^\n]*?) -->\n)?```python\n(?P<code>.*?)```", re.S
)


def _snippets():
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        for m in SNIPPET.finditer(text):
            line = text[: m.start("code")].count("\n")
            yield pytest.param(m["code"], m["why"], id=f"{path.name}:{line}")


@pytest.mark.parametrize(("code", "why"), list(_snippets()))
def test_every_python_snippet_runs_as_written(code, why, tiny_dirs, tmp_path, monkeypatch):
    """Each snippet is a whole program: imports, and `anyio.run` where it is async.
    The default model is swapped for a tiny one (the real one would take minutes
    over all of them); a snippet that defines a workflow's `run(rt, ...)` is run
    too. A snippet that cannot run here says why in a comment before it, and still
    has to compile."""
    compiled = compile(code, "<snippet>", "exec", dont_inherit=True)
    if why:
        pytest.skip(why)
    code = code.replace('"smollm2-135m"', repr(str(tiny_dirs["llama"])))
    monkeypatch.chdir(tmp_path)
    if "adapters/mqa" in code:  # the adapter `corps distill` would have written
        from helpers import peft_adapter

        peft_adapter(tiny_dirs["llama"], tmp_path / "adapters" / "mqa")
    scope: dict = {"__name__": "__snippet__"}
    exec(compile(code, "<snippet>", "exec", dont_inherit=True), scope)
    assert compiled is not None
    run = scope.get("run")
    if run is not None and inspect.iscoroutinefunction(run):
        anyio.run(_workflow, run, str(tiny_dirs["llama"]))


async def _workflow(run, model: str) -> None:
    from corps.agents import Runtime
    from corps.engine import Engine

    async with Engine.open(model) as engine, Runtime(engine) as rt:
        assert await run(rt) is not None


def _build(root: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
        cwd=root,
        capture_output=True,
        text=True,
    )


def test_the_docs_build_in_strict_mode(tmp_path):
    done = _build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    assert "decode_many" in api and "EngineConfig" in api  # docstrings were rendered


def test_a_broken_reference_fails_the_build(tmp_path):
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", copy / "docs", symlinks=True)
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    for pkg in ("engine", "cache", "agents", "patterns", "cli"):
        (copy / pkg).symlink_to(ROOT / pkg)
    page = copy / "docs" / "api.md"
    page.write_text(page.read_text() + "\n::: corps.engine.api.engine.NoSuchThing\n")
    assert _build(copy, tmp_path / "site").returncode != 0
    page.write_text(page.read_text().replace("::: corps.engine.api.engine.NoSuchThing", ""))
    (copy / "docs" / "index.md").write_text("[gone](no-such-page.md)\n")
    assert _build(copy, tmp_path / "site").returncode != 0


def test_the_readme_is_a_short_front_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    for page in ("docs/tutorial.md", "docs/concepts.md", "docs/cli.md", "docs/api.md"):
        assert page in readme and (ROOT / page).is_file()
