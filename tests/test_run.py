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
