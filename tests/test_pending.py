"""engine/api/pending.py: calls queued with a _nowait method and awaited later."""

from __future__ import annotations

import pytest

from corps.cache import AccessDenied, LeakageError, Private
from corps.engine import CallCancelled
from corps.engine.api.access import hidden_sources

from conftest import open_tiny


async def test_a_cancelled_pending_call_raises_when_awaited(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine:
        q = await engine.prefill("hello world")
        before = engine.stats()
        pending = engine.decode_nowait(parents=[q], max_tokens=8, ignore_eos=True)
        pending.cancel()
        with pytest.raises(CallCancelled):
            await pending
        after = engine.stats()
        assert (after.messages, after.tokens_used) == (before.messages, before.tokens_used)


async def test_nowait_calls_check_access_and_leak_policy(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine:
        secret = await engine.prefill("always defect", owner="alice", visibility=Private())
        public = await engine.prefill("hello world", parents=[secret], owner="alice")
        with pytest.raises(AccessDenied):
            engine.decode_nowait(parents=[secret], owner="bob", max_tokens=2)
        with pytest.raises(AccessDenied):
            engine.prefill_nowait("x", parents=[secret], owner="bob")
        with pytest.raises(LeakageError):
            engine.decode_nowait(parents=[public], owner="bob", max_tokens=2, leak_policy="deny")
        pending = engine.decode_nowait(
            parents=[public], owner="bob", max_tokens=2, leak_policy="reencode"
        )
        answer = await pending
        assert answer.parents[0] != public  # a clean copy was used
        assert hidden_sources(engine.executor.table, "bob", answer.id) == frozenset()
