"""patterns/run.py: a run's concurrent turns fail with a typed error, not a bare group."""

from __future__ import annotations

import anyio
import pytest

from corps.agents import AgentError, Runtime
from corps.cache.errors import CacheFullError, InvalidRequest
from corps.patterns.run import Run, first_error

from conftest import open_tiny


async def _fail(exc: BaseException) -> None:
    raise exc


async def test_first_error_raises_the_failure_itself_with_the_others_noted():
    with pytest.raises(CacheFullError) as caught:
        with first_error():
            async with anyio.create_task_group() as tg:
                tg.start_soon(_fail, CacheFullError("full"))  # both fail in the same step
                tg.start_soon(_fail, InvalidRequest("bad"))
    assert caught.value.__notes__ == ["also failed at the same time: InvalidRequest: bad"]


class Stop(BaseException):
    """Not an Exception: an exit or an interrupt, which first_error leaves grouped."""


async def test_first_error_leaves_an_exit_alone():
    with pytest.raises(BaseExceptionGroup):
        with first_error():
            async with anyio.create_task_group() as tg:
                tg.start_soon(_fail, Stop())


async def test_parallel_turns_that_fail_raise_an_agent_error(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine, Runtime(engine) as rt:
        async with Run(rt, "demo", max_tokens=4, temperature=0.0, top_p=1.0, seed=1) as run:
            a, b = await run.agent("a"), await run.agent("b")
            gone = await run.prefill("freed before use")
            engine.free(gone)
            with pytest.raises(AgentError, match="freed"):
                await run.parallel([(a, run.turn([gone])), (b, run.turn([gone]))])


@pytest.mark.parametrize("cancelled", [False, True])
async def test_a_run_frees_what_its_agents_made_that_it_never_received(tiny_dirs, cancelled):
    """A reply cut off by cancellation leaves a message the run holds no handle to,
    owned by one of its agents: the run's end frees it too (found by cancelling runs
    in the middle of a closed-loop load: 2 messages left behind in 1 run of ~8)."""
    async with open_tiny(tiny_dirs, "llama") as engine, Runtime(engine) as rt:
        with anyio.move_on_after(60) as scope:
            async with Run(rt, "demo", max_tokens=4, temperature=0.0, top_p=1.0, seed=1) as run:
                a = await run.agent("a")
                orphan = await engine.prefill("a reply nobody received", owner=a)
                if cancelled:
                    scope.cancel()
                    await anyio.sleep_forever()  # cancelled here
        assert scope.cancelled_caught == cancelled
        assert orphan.freed and engine.stats().tokens_used == 0
