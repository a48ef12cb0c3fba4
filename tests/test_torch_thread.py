"""engine/exec/torch_thread.py: one thread runs every engine's loads and steps, in order."""

from __future__ import annotations

import contextvars
import threading
import time

import anyio
import pytest

import corps.engine.api.engine as engine_module
from corps.engine import Engine
from corps.engine.exec.torch_thread import TORCH, TorchThread

from conftest import open_tiny


def test_calls_run_in_order_on_one_thread_whoever_calls():
    t = TorchThread(idle_s=5)
    seen: list[tuple[int, int]] = []

    def note(i: int) -> int:
        seen.append((i, threading.get_ident()))
        return i * i

    futures = [t.submit(note, i) for i in range(5)]
    others = [threading.Thread(target=t.call, args=(note, 5 + i)) for i in range(3)]
    for th in others:
        th.start()
    for th in others:
        th.join()
    assert [f.result() for f in futures] == [0, 1, 4, 9, 16]
    assert [i for i, _ in seen[:5]] == [0, 1, 2, 3, 4]
    assert {ident for _, ident in seen} == {t.ident} and t.ident != threading.get_ident()


def test_an_error_reaches_its_caller_and_the_thread_goes_on():
    t = TorchThread(idle_s=5)

    def boom() -> None:
        raise KeyError("x")

    with pytest.raises(KeyError):
        t.call(boom)
    assert t.call(lambda: 3) == 3


def test_a_call_sees_the_callers_context_variables():
    # torch's config patches (`torch._inductor.config.patch`) are context variables
    t = TorchThread(idle_s=5)
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    token = var.set("the caller's")
    try:
        assert t.call(var.get) == "the caller's"
    finally:
        var.reset(token)
    assert t.call(var.get) == "unset"


def test_a_call_from_the_thread_itself_runs_at_once():
    t = TorchThread(idle_s=5)
    assert t.call(lambda: t.call(lambda: threading.get_ident())) == t.ident


def test_an_idle_thread_ends_and_the_next_call_starts_another():
    t = TorchThread(idle_s=0.05)
    first = t.call(threading.current_thread)
    first.join(timeout=5)
    assert not first.is_alive() and t.ident is None
    second = t.call(threading.current_thread)
    assert second is not first and second.name == "corps-torch"


async def test_run_returns_and_raises_like_a_call():
    t = TorchThread(idle_s=5)
    assert await t.run(lambda x: x + 1, 1) == 2
    with pytest.raises(ZeroDivisionError):
        await t.run(lambda: 1 / 0)


async def test_a_cancelled_run_still_waits_for_its_work():
    t = TorchThread(idle_s=5)
    finished = threading.Event()

    def slow() -> None:
        time.sleep(0.2)
        finished.set()

    with anyio.move_on_after(0.01):
        await t.run(slow)
    assert finished.is_set()  # not abandoned half done


async def test_a_loop_blocked_in_a_call_does_not_deadlock_a_run_in_flight():
    t = TorchThread(idle_s=5)
    release = threading.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(t.run, release.wait)
        await anyio.sleep(0.05)  # the run's work is on the thread
        threading.Timer(0.1, release.set).start()
        # the loop thread blocks here; the run's result must not need the loop
        assert t.submit(lambda: 7).result(timeout=10) == 7


async def test_an_engine_loads_and_steps_on_the_torch_thread(tiny_dirs, monkeypatch):
    # a second thread entering torch's parallel regions slows every step (module doc)
    where: dict[str, set[threading.Thread]] = {"build": set(), "step": set()}
    build = engine_module.build_executor

    def noted_build(*args, **kwargs):
        where["build"].add(threading.current_thread())
        return build(*args, **kwargs)

    monkeypatch.setattr(engine_module, "build_executor", noted_build)
    engine = open_tiny(tiny_dirs)  # Engine.load, from this (the loop's) thread
    core = engine.executor
    step = core.step

    def noted_step(*args, **kwargs):
        where["step"].add(threading.current_thread())
        return step(*args, **kwargs)

    monkeypatch.setattr(core, "step", noted_step)
    async with engine:
        q = await engine.prefill("Hello there, how are you?")
        async with anyio.create_task_group() as tg:  # user code in anyio's workers beside
            for _ in range(3):
                tg.start_soon(anyio.to_thread.run_sync, time.sleep, 0.05)
            for _ in range(3):
                tg.start_soon(lambda: engine.decode(parents=[q], max_tokens=8))
    (thread,) = where["step"]  # every step on one thread, and the build there too
    assert where["build"] == {thread} and thread.name == TORCH.name


async def test_engine_open_loads_on_the_torch_thread_too(tiny_dirs, monkeypatch):
    seen: list[str] = []
    build = engine_module.build_executor

    def noted_build(*args, **kwargs):
        seen.append(threading.current_thread().name)
        return build(*args, **kwargs)

    monkeypatch.setattr(engine_module, "build_executor", noted_build)
    async with Engine.open(str(tiny_dirs["llama"]), dtype="float32", capacity=1024):
        pass
    assert seen == ["corps-torch"]
