from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from corps.engine.engine import Engine

from helpers import hf_model, make_model_dir

ARCHS = ["llama", "llama3-scaled", "mistral", "qwen2", "qwen3"]


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    dirs = {arch: make_model_dir(root / arch, arch) for arch in ARCHS}
    dirs["llama-sink"] = make_model_dir(root / "llama-sink", "llama", bos_sink=True)
    return dirs


@pytest.fixture(scope="session")
def tiny_hf(tiny_dirs):
    return {name: hf_model(path) for name, path in tiny_dirs.items()}


def open_tiny(tiny_dirs, name: str = "llama", **kwargs) -> Engine:
    kwargs.setdefault("capacity", 4096)
    return Engine.load(str(tiny_dirs[name]), **kwargs)


@pytest.fixture(scope="session")
def real_dir() -> Path:
    """The embedded default model, fetched and converted once into $CORPS_HOME."""
    from corps.engine.registry import resolve_model

    return resolve_model("smollm2-135m")


@pytest.fixture(scope="session")
def real_engine(real_dir) -> Engine:
    return Engine.load(str(real_dir), capacity=8192)


@pytest.fixture(scope="session")
def real_hf(real_dir):
    return hf_model(real_dir)
