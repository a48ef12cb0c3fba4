"""docs/ and mkdocs.yml: the documentation builds in strict mode (a broken link or
API reference fails it), and the README stays a short front page."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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
