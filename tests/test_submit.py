"""engine/submit.py: every call checked, pinned and queued; failures undo what they made."""

from __future__ import annotations

import pytest

from corps.cache import InvalidRequest, UnknownHandle

from conftest import open_tiny


async def test_many_calls_are_all_or_nothing(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine:
        q = await engine.prefill("hello world")
        before = engine.stats()
        bad_header = [10**6]  # outside the vocabulary: fails when the loop admits it
        with pytest.raises(InvalidRequest, match="vocabulary"):
            await engine.decode_many(
                [dict(parents=[q], max_tokens=2), dict(parents=[q], header=bad_header)]
            )
        await engine.prefill("x")  # one more trip through the loop
        after = engine.stats()
        assert after.messages == before.messages + 1  # only "x": the sibling was freed
        live = sum(len(m.slots) for m in engine._core.table.all() if not m.freed)
        assert after.tokens_used == live


async def test_free_after_submission_waits_for_the_queued_call(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine:
        q = await engine.prefill("hello world")
        pending = engine.decode_nowait(parents=[q], max_tokens=3, ignore_eos=True)
        engine.free(q)  # the call is queued, not yet admitted: it keeps q alive
        answer = await pending
        assert len(answer.tokens) > 0 and q.freed
        with pytest.raises(UnknownHandle):
            await engine.decode(parents=[q], max_tokens=2)
        live = sum(len(m.slots) for m in engine._core.table.all())
        assert engine.stats().tokens_used == live  # q's slots went once its reader ended
