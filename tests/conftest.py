from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import pytest
import torch

# Without a GPU the Triton kernels run on CPU tensors through Triton's interpreter
# (set before any kernel is built).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Engines of the tests decode eagerly unless a test asks for a precompiled step: an
# engine's default ("auto") would load one built by an earlier run, or start a build.
os.environ.setdefault("CORPS_PRECOMPILED", "off")

sys.path.insert(0, str(Path(__file__).parent))

from corps.engine.api.engine import Engine

from helpers import hf_model, make_model_dir

ARCHS = ["llama", "llama3-scaled", "mistral", "qwen2", "qwen3"]
#: where tiny engines and their transformers references run (`pytest --device cuda`)
DEVICE = "cpu"


def pytest_addoption(parser) -> None:
    parser.addoption(
        "--device",
        default="cpu",
        help="Device of the tiny engines and their HF references (open_tiny, tiny_hf): "
        "`--device cuda` runs the exactness tests against transformers on a GPU.",
    )


def same_encoding(a: torch.Tensor, b: torch.Tensor) -> bool:
    """K/V made twice alike: bit for bit on a CPU; on a GPU within float32 rounding
    (kernels there depend on the step's shape and on whether it ran in a CUDA graph:
    the first H200 run of the check found recomputed encodings unequal bit for bit)."""
    if DEVICE == "cpu":
        return torch.equal(a, b)
    return torch.allclose(a, b, rtol=0.0, atol=1e-5)


def batch_rounding() -> float:
    """How far a row's logits may move when its step holds other rows (float32): on a
    GPU the matrix products pick kernels by shape (1.6e-5 seen on an H200)."""
    return 1e-5 if DEVICE == "cpu" else 5e-5


def pytest_configure(config) -> None:
    global DEVICE
    DEVICE = config.getoption("--device")


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    dirs = {arch: make_model_dir(root / arch, arch) for arch in ARCHS}
    dirs["llama-sink"] = make_model_dir(root / "llama-sink", "llama", bos_sink=True)
    return dirs


@pytest.fixture(autouse=True)
def _collect_real_engines(request):
    """A test that loaded the real model leaves engines in reference cycles; collect
    them now rather than let several hundred MB each pile up across the suite."""
    yield
    if "real_dir" in request.fixturenames:
        gc.collect()


@pytest.fixture(params=["torch", "triton", "flex", "store"])
def backend(request, monkeypatch) -> str:
    """Run the test once per attention backend (CORPS_ATTENTION); Triton interpreted.
    "store" is the torch backend with contexts read from the store (CORPS_CONTEXTS)."""
    if "triton" in request.param:
        pytest.importorskip("triton")
    if request.param == "store":
        monkeypatch.setenv("CORPS_ATTENTION", "torch")
        monkeypatch.setenv("CORPS_CONTEXTS", "store")
    else:
        monkeypatch.setenv("CORPS_ATTENTION", request.param)
    return request.param


@pytest.fixture(scope="session")
def tiny_hf(tiny_dirs):
    return {name: hf_model(path).to(DEVICE) for name, path in tiny_dirs.items()}


def open_tiny(tiny_dirs, name: str = "llama", **kwargs) -> Engine:
    """An engine on a tiny model: float32 unless asked (exact against transformers;
    the default dtype, mixed, is within 16-bit rounding)."""
    kwargs.setdefault("capacity", 4096)
    kwargs.setdefault("dtype", "float32")
    kwargs.setdefault("device", DEVICE)
    return Engine.load(str(tiny_dirs[name]), **kwargs)


@pytest.fixture(scope="session")
def real_dir() -> Path:
    """The embedded default model, fetched and converted once into $CORPS_HOME."""
    from corps.engine.model.names import resolve_model

    return resolve_model("smollm2-135m")


@pytest.fixture(scope="session")
def real_engine(real_dir) -> Engine:
    # float32 and dense weights: exact against transformers
    return Engine.load(str(real_dir), capacity=8192, dtype="float32", weights="dense")


@pytest.fixture(scope="session")
def real_hf(real_dir):
    return hf_model(real_dir)


TRACE_SETTINGS = {
    "debate": dict(rounds=2),
    "parallel_debate": dict(agents=3, rounds=2),
    "tree_of_thoughts": dict(branches=4, voters=3),
    "branch_solve_merge": dict(concepts=["dog", "park", "rain", "kite"]),
    "map_reduce": dict(chunk_tokens=128, fan_in=2),
    "multi_qa": dict(),
    "prisoners_dilemma": dict(leak_policy="warn"),
}


@pytest.fixture(scope="session")
def traces(tiny_dirs, tmp_path_factory) -> dict[str, Path]:
    """A trace of every built-in pattern on a tiny model (plain choreography: no
    decision-step repair, so the debate takes the same rounds in both modes), plus
    `debate@baseline`, keyed by pattern name."""
    import warnings

    import anyio

    from corps.agents import Runtime
    from corps.cache.visibility import LeakWarning
    from corps.patterns import run_pattern
    from corps.patterns.samples import DOCUMENT_PARAGRAPHS

    root = tmp_path_factory.mktemp("traces")
    out: dict[str, Path] = {}
    jobs = [(name, "choreographed") for name in TRACE_SETTINGS] + [("debate", "baseline")]

    async def one(name: str, mode: str) -> Path:
        path = root / f"{name}-{mode}.jsonl"
        params = dict(max_tokens=6, seed=3, **TRACE_SETTINGS[name])
        if name == "map_reduce":
            params["document"] = " ".join(DOCUMENT_PARAGRAPHS[:3])
        plain = dict(decision_repair="none")
        async with open_tiny(tiny_dirs, "llama", mode=mode, trace=path, **plain) as engine:
            async with Runtime(engine) as rt:
                await run_pattern(rt, name, params)
        return path

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LeakWarning)
        for name, mode in jobs:
            key = name if mode == "choreographed" else f"{name}@{mode}"
            out[key] = anyio.run(one, name, mode)
    return out
