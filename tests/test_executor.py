"""engine/exec/executor.py: both executors offer what the loop and the engine use."""

from __future__ import annotations

import inspect

import pytest

from corps.engine.exec.executor import Executor
from corps.engine.exec.hf import HFExecutor
from corps.engine.exec.kv_executor import KVExecutor

from conftest import open_tiny

METHODS = [
    name for name, member in vars(Executor).items() if callable(member) and not name.startswith("_")
]


@pytest.mark.parametrize("cls", [KVExecutor, HFExecutor])
def test_each_executor_has_every_method_with_its_signature(cls):
    assert set(METHODS) >= {"admit", "step", "abort", "free", "check", "close", "gauges"}
    for name in METHODS:
        ours = inspect.signature(getattr(cls, name)).parameters
        want = inspect.signature(getattr(Executor, name)).parameters
        assert list(ours) == list(want), (cls.__name__, name)


@pytest.mark.parametrize("cls", [KVExecutor, HFExecutor])
def test_each_executor_has_every_attribute_the_protocol_names(cls, tiny_dirs):
    from corps.engine import EngineConfig
    from corps.engine.api.build import build_executor

    mode = "hf" if cls is HFExecutor else "choreographed"
    executor = build_executor(EngineConfig.of(str(tiny_dirs["llama"]), mode=mode, dtype="float32"))
    assert isinstance(executor, cls)
    for name in Executor.__annotations__:
        assert hasattr(executor, name), (cls.__name__, name)


def test_the_engine_and_its_loop_use_the_executor_through_the_protocol_only():
    """api/ and sched/ read no attribute of the executor that `Executor` does not name."""
    import ast
    from pathlib import Path

    named = set(Executor.__annotations__) | set(METHODS)
    root = Path(__file__).resolve().parents[1] / "engine"
    used = set()
    for path in [*root.joinpath("api").glob("*.py"), *root.joinpath("sched").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
                if node.value.attr in ("executor", "_executor"):
                    used.add(f"{path.name}: {node.attr}")
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                if node.value.id == "executor":
                    used.add(f"{path.name}: {node.attr}")
    assert used and sorted(u for u in used if u.split(": ")[1] not in named) == []


@pytest.mark.parametrize("mode", ["choreographed", "baseline", "hf"])
async def test_the_engine_runs_on_the_executor_of_its_mode(tiny_dirs, mode):
    async with open_tiny(tiny_dirs, "llama", mode=mode) as engine:
        q = await engine.prefill("hello world")
        a = await engine.decode(parents=[q], max_tokens=3, ignore_eos=True)
        assert len(a.generated) == 3
        engine.check()
        assert engine.stats().mode == mode
