"""engine/sched/job.py: one call's job in the loop; its callbacks fail that call alone."""

from __future__ import annotations

import pytest

from corps.engine.request.requests import decode_request

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
