"""engine/sched/job.py: one call's job in the loop; its callbacks fail that call alone."""

from __future__ import annotations

import pytest

from corps.engine.request.requests import decode_request
from corps.engine.sched.job import Job

from conftest import open_tiny

PROMPTS = ["hello world", "the quick brown fox", "what is seven", "you are a careful solver"]


async def test_a_failing_callback_fails_its_call_only(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine:
        q = await engine.prefill("hello world")
        messages = engine.stats().messages

        def explode(tok: int) -> None:
            raise RuntimeError("callback broke")

        job = await engine._submit.job(
            decode_request(dict(parents=[q], max_tokens=8, ignore_eos=True))
        )
        job.on_token = explode
        other = engine.decode(parents=[q], max_tokens=8, ignore_eos=True)
        await engine._sched.submit(job)
        with pytest.raises(RuntimeError, match="callback broke"):
            await job.wait()
        assert len((await other).tokens) > 0  # the engine is alive and serving
        await engine.prefill("x")
        assert engine.stats().messages == messages + 2  # other and "x"; nothing of the job
        live = sum(m.slots for m in engine.messages())
        assert engine.stats().tokens_used == live


def test_a_job_cancelled_in_the_step_that_finished_it_frees_its_message():
    """Its waiter is gone (a stream left, a callback failed): nobody will take the
    message, so ending the job gives it back (found by `corps serve`'s disconnect test:
    a stream cut as its last step ran left its reply in the store)."""
    from corps.engine.sched.scheduler import Scheduler

    class Executor:  # the two calls `Scheduler.end` makes of it, recorded
        def __init__(self):
            self.freed, self.table = [], None

        def unpin(self, msgs):
            pass

        def free(self, handle):
            self.freed.append(handle)

    core = Executor()
    core.table = type("T", (), {"get": lambda self, i: type("M", (), {})()})()
    sched = Scheduler(core)
    job = Job(request=None)
    job.handle, job.cancelled = "the message", True
    sched.end(job)
    assert core.freed == ["the message"] and job.handle is None and job.done.is_set()
    kept = Job(request=None)
    kept.handle = type("H", (), {"id": 0})()
    sched.end(kept)
    assert core.freed == ["the message"] and kept.handle is not None
