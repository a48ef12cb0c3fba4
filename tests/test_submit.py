"""engine/api/submit.py: every call checked, pinned and queued; failures undo what they made."""

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
        live = sum(m.slots for m in engine.messages() if not m.freed)
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
        live = sum(m.slots for m in engine.messages())
        assert engine.stats().tokens_used == live  # q's slots went once its reader ended


def test_deduce_objective_marks_a_latency_workflows_groups_not_critical():
    from corps.engine.api.submit import deduce_objective
    from corps.engine.request.workflow import Workflow

    chat, batch = Workflow("chat", "latency"), Workflow("data", "throughput")
    assert deduce_objective(None, chat, 1) == ("latency", True)  # made alone
    assert deduce_objective(None, chat, 4) == ("latency", False)  # a task group
    assert deduce_objective(None, chat, 4, deduce=False) == ("latency", True)
    assert deduce_objective(None, batch, 4) == ("throughput", False)
    assert deduce_objective(None, None, 1) == ("throughput", False)
    assert deduce_objective("latency", batch, 4) == ("latency", True)  # asked: as asked
    assert deduce_objective("throughput", chat, 1) == ("throughput", False)


@pytest.mark.parametrize("deduce", [True, False])
async def test_calls_carry_their_deduced_objective_into_the_trace(tiny_dirs, tmp_path, deduce):
    from corps.engine.trace.reader import Trace

    path = tmp_path / "t.jsonl"
    async with open_tiny(tiny_dirs, trace=path, deduce_objectives=deduce) as engine:
        with engine.workflow("summary", objective="latency"):
            q = await engine.prefill("hello world")
            maps = await engine.decode_many([dict(parents=[q], max_tokens=2)] * 3)
            await engine.decode(parents=[q, *maps], max_tokens=2)
    queued = [rec.queued for _, rec in sorted(Trace.load(path).calls.items())]
    group = [e for e in queued if e.group == queued[1].call]
    assert len(group) == 3 and all(e.objective == "latency" for e in queued)
    assert [e.critical for e in group] == [not deduce] * 3
    assert queued[0].critical and queued[-1].critical  # made alone
