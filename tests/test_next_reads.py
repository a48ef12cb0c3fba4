"""engine/sched/next_reads.py and `Engine.expect`: eviction takes what no workflow's next
step reads first, in the policy's order otherwise; expectations end with their
workflow; an expected message evicted to the store comes back before its reader
(prefetch); bad handles change nothing."""

from __future__ import annotations

import gc
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corps.cache.errors import ForeignHandle, UnknownHandle
from corps.engine.errors import InvalidRequest
from corps.engine.request.workflow import Workflow
from corps.engine.sched.next_reads import NextReads
from corps.engine.sched.policies import least_recent

from conftest import open_tiny


def message(mid: int, read_at: int) -> SimpleNamespace:
    return SimpleNamespace(id=mid, read_at=read_at)


@given(
    st.lists(st.integers(0, 50), min_size=0, max_size=12),
    st.sets(st.integers(0, 11), max_size=12),
)
def test_order_is_the_policy_s_with_expected_messages_last(reads, expected):
    """Brute force: the unexpected in the policy's order, then the expected in it."""
    candidates = [message(i, r) for i, r in enumerate(reads)]
    nr = NextReads()
    wf = Workflow("w")
    nr.expect(wf, expected)
    got = [m.id for m in nr.order(least_recent)(candidates)]
    ranked = [m.id for m in least_recent(candidates)]
    want = [i for i in ranked if i not in expected] + [i for i in ranked if i in expected]
    assert got == want


def test_an_expectation_is_replaced_cleared_and_ends_with_its_workflow():
    nr = NextReads()
    a, b = Workflow("a"), Workflow("b")
    nr.expect(a, [1, 2])
    nr.expect(b, [3])
    nr.expect(None, [9])  # calls outside any workflow
    assert nr.wanted() == {1, 2, 3, 9}
    nr.expect(a, [2])  # replaces a's
    assert nr.wanted() == {2, 3, 9}
    nr.expect(b, [])  # clears b's
    assert nr.wanted() == {2, 9}
    del a
    gc.collect()  # the workflow's tag is gone: so is what it expected
    assert nr.wanted() == {9}


def test_prefetch_asks_the_executor_only_for_expected_messages():
    asked = []
    executor = SimpleNamespace(prefetch=lambda ids: asked.append(set(ids)) or 7)
    nr = NextReads()
    assert nr.prefetch(executor) == 0 and asked == []  # nothing expected: not asked
    wf = Workflow("w")
    nr.expect(wf, [4, 5])
    assert nr.prefetch(executor) == 7 and asked == [{4, 5}]


def evicted(engine, handle) -> bool:
    return next(r for r in engine.messages() if r.id == handle.id).evicted


@pytest.mark.parametrize("expect", [False, True])
async def test_a_full_store_evicts_what_no_next_step_reads(tiny_dirs, expect):
    """Two unread messages, the same age: least recent alone drops the older (the doc);
    with the doc expected, the other goes and the doc stays."""
    async with open_tiny(tiny_dirs, capacity=200) as engine:
        with engine.workflow("w"):
            doc = await engine.prefill(list(range(5, 75)), frame=False)
            scratch = await engine.prefill(list(range(100, 170)), frame=False)
            if expect:
                engine.expect(doc)
            await engine.prefill(list(range(200, 270)), frame=False)  # needs room
        assert (evicted(engine, doc), evicted(engine, scratch)) == (not expect, expect)
        assert engine.stats().messages_evicted == 1
        engine.check()


async def test_an_expected_message_comes_back_from_the_store_before_its_reader(tiny_dirs, tmp_path):
    """Evicted to the store, then expected: once the store has room again, the next
    admission copies it back (prefetch), and its reader recomputes nothing."""
    async with open_tiny(tiny_dirs, capacity=200, store=tmp_path / "s") as engine:
        doc = await engine.prefill(list(range(5, 75)), frame=False)
        scratch = await engine.prefill(list(range(100, 170)), frame=False)
        big = await engine.prefill(list(range(200, 270)), frame=False)  # evicts the doc
        assert evicted(engine, doc)
        engine.free(big)
        engine.free(scratch)
        engine.expect(doc)  # outside any workflow
        await engine.prefill("a small call", frame=False)  # an admission: room now
        assert not evicted(engine, doc)
        s = engine.stats()
        assert s.tokens_prefetched == doc.length and s.tokens_spilled == 0
        reply = await engine.decode(parents=[doc], max_tokens=2, ignore_eos=True)
        assert len(reply.generated) == 2
        assert engine.stats().tokens_recomputed == 0
        engine.check()


async def test_without_a_store_nothing_is_prefetched_and_the_reader_recomputes(tiny_dirs):
    async with open_tiny(tiny_dirs, capacity=200) as engine:
        doc = await engine.prefill(list(range(5, 75)), frame=False)
        await engine.prefill(list(range(100, 170)), frame=False)
        await engine.prefill(list(range(200, 270)), frame=False)
        assert engine.stats().tokens_spilled == doc.length
        engine.expect(doc)
        await engine.prefill("a small call", frame=False)
        assert evicted(engine, doc) and engine.stats().tokens_prefetched == 0


async def test_bad_handles_are_refused_and_change_nothing(tiny_dirs):
    async with open_tiny(tiny_dirs) as engine, open_tiny(tiny_dirs) as other:
        kept = await engine.prefill("kept")
        gone = await engine.prefill("gone")
        engine.free(gone)
        foreign = await other.prefill("elsewhere")
        engine.expect(kept)
        reads = engine._sched.admission.next_reads  # the registry the test checks
        for bad, error in [
            ("kept", InvalidRequest),
            (kept.id, InvalidRequest),
            (None, InvalidRequest),
            (gone, UnknownHandle),
            (foreign, ForeignHandle),
        ]:
            with pytest.raises(error):
                engine.expect(kept, bad)
            assert reads.wanted() == {kept.id}
        engine.expect()
        assert reads.wanted() == set()
