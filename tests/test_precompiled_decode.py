"""The decode step compiled ahead of time (corps.engine.model.precompiled_decode) and
its background build (corps.engine.api.precompile) against the eager step."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
from test_compiled_decode import _workflow, assert_same_replies

from corps.engine.api import precompile
from corps.engine.config import BadConfig, EngineConfig

from conftest import open_tiny
from helpers import make_model_dir


@pytest.fixture(scope="module")
def home(tiny_dirs, tmp_path_factory):
    """A $CORPS_HOME whose steps/ holds the package of tiny llama on int4 weights,
    built once for the module (`precompiled="build"`)."""
    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CORPS_HOME", str(home))
        engine = open_tiny(tiny_dirs, weights="int4", precompiled="build")
        assert engine.executor.runner.compiled is not None
        engine.executor.close()
    return home


def _packages(home) -> list:
    return sorted(p.name for p in (home / "steps").glob("*.pt2"))


async def test_precompiled_step_gives_the_eager_tokens_and_logprobs(tiny_dirs, home, monkeypatch):
    monkeypatch.setenv("CORPS_HOME", str(home))
    async with open_tiny(tiny_dirs, weights="int4", precompiled="off") as eager:
        assert eager.executor.runner.compiled is None
        want = await _workflow(eager)
    async with open_tiny(tiny_dirs, weights="int4", precompiled="auto") as pre:
        got = await _workflow(pre)
        graph = pre.executor.runner.compiled
        stats = pre.stats()
    assert_same_replies(want, got)
    # both kinds of view went through the package; nothing was built again
    assert graph.steps["slice"] > 0 and graph.steps["shared"] > 0
    assert stats.compiled_steps == sum(graph.steps.values())
    assert len(_packages(home)) == 1 and not precompile._WAITING


async def test_one_package_serves_other_weights_of_the_same_shapes(
    tiny_dirs, home, tmp_path, monkeypatch
):
    """The package holds code, not weights: a model of the same shapes with other
    weights loads it and decodes as its own eager step does."""
    other = make_model_dir(tmp_path / "other", "llama", seed=7)
    monkeypatch.setenv("CORPS_HOME", str(home))
    async with open_tiny({"o": other}, "o", weights="int4", precompiled="off") as eager:
        want = await _workflow(eager)
    async with open_tiny({"o": other}, "o", weights="int4", precompiled="auto") as pre:
        assert pre.executor.runner.compiled is not None
        got = await _workflow(pre)
    assert [m.tokens for m in got] == [m.tokens for m in want]
    async with open_tiny(tiny_dirs, weights="int4", precompiled="off") as first:
        firsts = await _workflow(first)
    assert [m.tokens for m in firsts] != [m.tokens for m in want]  # the weights differ
    assert len(_packages(home)) == 1


async def test_a_package_that_cannot_be_read_is_left_for_the_eager_step(
    tiny_dirs, home, tmp_path, monkeypatch
):
    broken = tmp_path / "home"
    (broken / "steps").mkdir(parents=True)
    for p in (home / "steps").glob("*.*"):
        data = b"\x00not a package" if p.suffix == ".pt2" else p.read_bytes()
        (broken / "steps" / p.name).write_bytes(data)
    monkeypatch.setenv("CORPS_HOME", str(broken))
    with pytest.warns(RuntimeWarning, match="cannot be loaded.*decoding eagerly"):
        engine = open_tiny(tiny_dirs, weights="int4", precompiled="auto")
    try:
        assert engine.executor.runner.compiled is None
        assert len(precompile._WAITING) == 1  # built again, over it, after this process
    finally:
        engine.executor.close()
        proc = precompile._WAITING.pop()
        proc.kill()
        proc.wait()
        proc.stdin.close()


async def test_a_baseline_engine_decodes_through_the_package_too(tiny_dirs, home, monkeypatch):
    monkeypatch.setenv("CORPS_HOME", str(home))
    async with open_tiny(tiny_dirs, mode="baseline", weights="int4", precompiled="off") as e:
        want = await _workflow(e)
    async with open_tiny(tiny_dirs, mode="baseline", weights="int4", precompiled="auto") as e:
        got = await _workflow(e)
        steps = e.stats().compiled_steps
    assert_same_replies(want, got)
    assert steps > 0 and len(_packages(home)) == 1


def test_dense_weights_and_explicit_settings_build_nothing(tiny_dirs, tmp_path, monkeypatch):
    monkeypatch.setenv("CORPS_HOME", str(tmp_path))
    store = dict(contexts="store", attention="torch")
    for kw in (dict(precompiled="auto"), dict(weights="int4", precompiled="off"),
               dict(weights="int4", precompiled="auto", **store)):  # fmt: skip
        engine = open_tiny(tiny_dirs, **kw)
        assert engine.executor.runner.compiled is None and engine.executor.step_missing is None
        engine.executor.close()
    assert not (tmp_path / "steps").exists() and not precompile._WAITING


def test_auto_builds_once_in_the_background_after_the_process_exits(
    tiny_dirs, tmp_path, monkeypatch
):
    """Without a package, "auto" decodes eagerly and starts one build, which waits for
    the end of its stdin (this process's exit: closed here by hand); a second engine
    meanwhile starts none; after the build, engines load the package."""
    monkeypatch.setenv("CORPS_HOME", str(tmp_path))
    engine = open_tiny(tiny_dirs, weights="int4", precompiled="auto")
    package = engine.executor.step_missing
    try:
        assert engine.executor.runner.compiled is None and package is not None
        assert len(precompile._WAITING) == 1 and package.with_suffix(".lock").exists()
        again = open_tiny(tiny_dirs, weights="int4", precompiled="auto")
        assert again.executor.step_missing == package and len(precompile._WAITING) == 1
        again.executor.close()
    finally:
        engine.executor.close()
    proc = precompile._WAITING.pop()
    proc.stdin.close()  # as this process's exit would
    assert proc.wait(timeout=900) == 0, package.with_suffix(".log").read_text()
    assert package.is_file() and not package.with_suffix(".lock").exists()
    assert "built in" in package.with_suffix(".log").read_text()
    engine = open_tiny(tiny_dirs, weights="int4", precompiled="auto")
    assert engine.executor.runner.compiled is not None and engine.executor.step_missing is None
    engine.executor.close()


def test_a_lock_whose_build_is_gone_is_taken_over(tmp_path):
    lock = tmp_path / "x.lock"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    lock.write_text(str(gone.pid))
    assert precompile._take(lock) and lock.read_text() != str(gone.pid)
    assert not precompile._take(lock)  # held by this live process now
    lock.write_text("not a pid")
    assert precompile._take(lock)


def test_the_setting_is_checked_and_its_environment_default_too(monkeypatch):
    with pytest.raises(BadConfig, match="precompiled"):
        EngineConfig.of(precompiled="sometimes")
    assert EngineConfig.of(precompiled=" OFF ").precompiled == "off"
    monkeypatch.setenv("CORPS_PRECOMPILED", "build")
    assert EngineConfig.of().precompiled == "build"
    monkeypatch.setenv("CORPS_PRECOMPILED", "bogus")
    with pytest.raises(BadConfig, match="precompiled"):
        EngineConfig.of()
    monkeypatch.delenv("CORPS_PRECOMPILED")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert EngineConfig.of().precompiled == "auto"


def test_a_cache_it_cannot_write_starts_nothing_and_the_engine_opens(
    tiny_dirs, tmp_path, monkeypatch
):
    home = tmp_path / "ro"
    home.mkdir()
    (home / "steps").write_text("a file where the folder should be")
    monkeypatch.setenv("CORPS_HOME", str(home))
    engine = open_tiny(tiny_dirs, weights="int4", precompiled="auto")
    try:
        assert engine.executor.runner.compiled is None and not precompile._WAITING
    finally:
        engine.executor.close()
