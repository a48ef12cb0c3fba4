"""Bad input: each a typed error with a clear message, the store left exactly as it was."""

from __future__ import annotations

import anyio
import pytest

from corps.cache.errors import CacheFullError, PositionError, StoreTooSmall, UnknownHandle
from corps.engine.errors import InvalidRequest

from conftest import open_tiny
from helpers import run_calls


def snapshot(engine):
    core = engine.executor
    return (
        engine.stats().tokens_used,
        len(core.table),
        sorted(core.memory.store._free),
        [(m.id, m.pins, m.freed, tuple(m.slots)) for m in core.table.all()],
    )


def small(tiny_dirs, **kwargs):
    return open_tiny(tiny_dirs, "llama", capacity=200, **kwargs)


async def test_bad_inputs_raise_typed_errors_and_change_nothing(tiny_dirs):
    async with small(tiny_dirs) as engine:
        s = await engine.prefill("you are a careful solver", role="system")
        q = await engine.prefill("what is seven", parents=[s])
        gone = await engine.prefill("hello world")
        engine.free(gone)
        async with open_tiny(tiny_dirs, "llama") as other:
            foreign = await other.prefill("hello")
            cases = [
                (UnknownHandle, "freed", engine.decode(parents=[s, gone], max_tokens=4)),
                (UnknownHandle, "another engine", engine.prefill("x", parents=[foreign])),
                (
                    PositionError,
                    "2 parents",
                    engine.decode(parents=[s, q], offsets=[0], max_tokens=4),
                ),
                (PositionError, ">= 0", engine.prefill("x", parents=[s], offsets=[-1])),
                (
                    PositionError,
                    "context length",
                    engine.prefill("x", parents=[s], offsets=[10**6]),
                ),
                (PositionError, "context length", engine.decode(parents=[s], max_tokens=10**6)),
                (
                    InvalidRequest,
                    "non-empty header",
                    engine.decode(parents=[s], frame=False, max_tokens=4),
                ),
                (InvalidRequest, "max_tokens", engine.decode(parents=[s], max_tokens=0)),
                (InvalidRequest, "temperature", engine.decode(parents=[s], temperature=-1.0)),
                (InvalidRequest, "vocabulary", engine.prefill([10**7], frame=False)),
                (InvalidRequest, "Handles", engine.prefill("x", parents=["not a handle"])),
            ]
            before = snapshot(engine)
            for kind, words, call in cases:
                with pytest.raises(kind, match=words):
                    await call
                assert snapshot(engine) == before, kind


async def test_a_call_that_could_never_fit_fails_before_running(tiny_dirs):
    async with small(tiny_dirs) as engine:
        s = await engine.prefill("you are a careful solver", role="system")
        before = snapshot(engine)
        with pytest.raises(StoreTooSmall, match="whole store has 200"):
            await engine.decode(parents=[s], max_tokens=400, ignore_eos=True)
        assert snapshot(engine) == before
        ok = await engine.decode(parents=[s], max_tokens=5, ignore_eos=True)
        assert len(ok.tokens) > 5
        with pytest.raises(StoreTooSmall, match="needs 245 token slots"):
            await engine.prefill(list(range(5, 250)), frame=False)


async def test_a_full_store_with_nothing_running_fails_at_once_without_eviction(tiny_dirs):
    async with small(tiny_dirs, evict=False) as engine:
        kept = await engine.prefill(list(range(5, 105)), frame=False)
        await engine.prefill(list(range(5, 85)), frame=False)  # 180 of 200 slots used
        before = snapshot(engine)
        with pytest.raises(CacheFullError, match="slots needed"):  # fits an empty store
            await engine.decode(parents=[kept], max_tokens=20, ignore_eos=True)
        assert snapshot(engine) == before


async def test_a_full_store_with_nothing_running_evicts_what_no_call_reads(tiny_dirs):
    """With eviction (the default) the same call runs: the unread message's encoding
    goes (its handle still reads), the parent's stays."""
    async with small(tiny_dirs) as engine:
        kept = await engine.prefill(list(range(5, 105)), frame=False)
        other = await engine.prefill(list(range(5, 85)), frame=False)
        reply = await engine.decode(parents=[kept], max_tokens=20, ignore_eos=True)
        assert len(reply.generated) == 20 and other.tokens == list(range(5, 85))
        stats = engine.stats()
        assert stats.messages_evicted == 1 and stats.tokens_evicted == 80
        engine.check()


async def test_calls_wait_for_memory_instead_of_failing_mid_generation(tiny_dirs):
    """More concurrent long decodes than the store holds: each waits until running ones
    give memory back; none fails, and each decodes what it decodes alone (greedy)."""
    async with small(tiny_dirs) as engine:
        q = await engine.prefill("count")
        alone = []
        for i in range(3):
            h = await engine.decode(parents=[q], max_tokens=30 + i, ignore_eos=True)
            alone.append(h.generated)
            engine.free(h)

        async def one(i: int, out: list) -> None:
            h = await engine.decode(parents=[q], max_tokens=30 + i % 3, ignore_eos=True)
            out[i] = h.generated
            engine.free(h)  # the caller is done with it: its memory goes back

        out: list = [None] * 16  # 16 x ~40 slots: at most 4 fit in the 200-slot store
        async with anyio.create_task_group() as tg:
            for i in range(16):
                tg.start_soon(one, i, out)
        assert all(out[i] == alone[i % 3] for i in range(16))
        assert engine.stats().tokens_used == q.length


async def test_free_releases_slots_and_pins_defer(tiny_dirs):
    async with small(tiny_dirs) as engine:
        s = await engine.prefill("you are a careful solver", role="system")
        used = engine.stats().tokens_used
        engine.free(s)
        assert engine.stats().tokens_used == used - s.length
        assert s.text == "you are a careful solver"  # metadata survives
        with pytest.raises(UnknownHandle):
            engine.free(s)


def test_parent_freed_mid_decode_stays_until_the_call_ends(tiny_dirs):
    from corps.engine.request.requests import DecodeRequest, PrefillRequest
    from corps.engine.request.sampling_params import SamplingParams

    core = open_tiny(tiny_dirs, "llama").executor
    (p,), _ = run_calls(core, [PrefillRequest("the quick brown fox")])
    req = DecodeRequest(parents=[p], sampling=SamplingParams(max_tokens=8, ignore_eos=True))
    (undisturbed,) = run_calls(core, [req])[0]
    freed_during = []

    def free_once(i: int, tok: int) -> None:
        if not freed_during:
            core.free(p)
            freed_during.append(len(core.table.get(p.id).slots))

    (h,) = run_calls(core, [req], on_token=free_once)[0]
    assert freed_during == [p.length]  # still held while the call ran
    assert core.table.get(p.id).slots == []  # released when it ended
    assert h.tokens == undisturbed.tokens
