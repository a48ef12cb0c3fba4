"""The wheel built from a clone holds every module of the source tree (setup.py finds
packages instead of listing them: a listed set once left out corps.engine.attention)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("engine", "cache", "agents", "patterns", "serve", "view", "bench", "cli")
SKIP = shutil.ignore_patterns(
    ".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis"
)


def source_modules() -> set[str]:
    """corps.<folder>/... paths of every .py file under the package folders."""
    return {
        f"corps/{path.relative_to(ROOT).as_posix()}"
        for folder in FOLDERS
        for path in (ROOT / folder).rglob("*.py")
        if "__pycache__" not in path.parts
    }


def test_every_source_module_is_in_the_wheel(tmp_path):
    src = tmp_path / "src"  # a copy: building writes build/ and *.egg-info beside the sources
    shutil.copytree(ROOT, src, ignore=SKIP)
    out = tmp_path / "wheel"
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    (wheel,) = out.glob("corps-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        shipped = {n for n in zf.namelist() if n.endswith(".py")}
    expected = source_modules()
    assert len(expected) > 100  # the tree was found
    assert expected - shipped == set(), "modules missing from the wheel"
    assert shipped - expected == set(), "the wheel ships modules the tree does not have"


def test_the_folders_are_setup_pys():
    """setup.py's `ROOTS` are the folders checked here (and tests/test_layers.py's)."""
    import ast

    tree = ast.parse((ROOT / "setup.py").read_text())
    (roots,) = [n.value for n in tree.body if isinstance(n, ast.Assign)
                and getattr(n.targets[0], "id", "") == "ROOTS"]  # fmt: skip
    assert set(ast.literal_eval(roots)) == set(FOLDERS)
