"""engine/exec/executor.py: both executors offer what the loop and the engine use."""

from __future__ import annotations

import inspect

import pytest

from corps.engine.exec.core import Core
from corps.engine.exec.executor import Executor
from corps.engine.exec.hf import HFExecutor

from conftest import open_tiny

METHODS = [
    name for name, member in vars(Executor).items() if callable(member) and not name.startswith("_")
]


@pytest.mark.parametrize("cls", [Core, HFExecutor])
def test_each_executor_has_every_method_with_its_signature(cls):
    assert set(METHODS) >= {"admit", "step", "finish", "abort", "free", "check", "close"}
    for name in METHODS:
        ours = inspect.signature(getattr(cls, name)).parameters
        want = inspect.signature(getattr(Executor, name)).parameters
        assert list(ours) == list(want), (cls.__name__, name)


@pytest.mark.parametrize("mode", ["choreographed", "baseline", "hf"])
async def test_the_engine_runs_on_the_executor_of_its_mode(tiny_dirs, mode):
    async with open_tiny(tiny_dirs, "llama", mode=mode) as engine:
        q = await engine.prefill("hello world")
        a = await engine.decode(parents=[q], max_tokens=3, ignore_eos=True)
        assert len(a.generated) == 3
        engine.check()
        assert engine.stats().mode == mode
