"""cache/host_tier.py: evicted encodings kept in host memory within a byte budget, the
least recently put moving down to the tier below (or dropped), taken back whole,
discarded with their message; and, under an engine's store (forced here on a CPU,
where the engine only puts it under a GPU's store), a crowded engine decodes as
one with room, copying back from host memory and recomputing nothing."""

from __future__ import annotations

import anyio
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from corps.cache.host_tier import HostTier
from corps.cache.messages import Message

import conftest
from conftest import open_tiny


def msg(mid: int) -> Message:
    return Message(
        id=mid, tokens=[1, 2], text="", role="user", kind="prefill", slots=[], offset=0,
        parents=(), parent_offsets=(),
    )  # fmt: skip


def kv(n: int, fill: float) -> tuple[torch.Tensor, torch.Tensor]:
    k = torch.full((2, n, 1, 4), fill)  # (L, n, Hkv, D), 4 bytes each
    return k, -k


class Recorder:
    """A tier below that keeps what it is given, in order."""

    def __init__(self) -> None:
        self.kept: dict[int, tuple] = {}
        self.order: list[int] = []
        self.discarded: list[int] = []

    def put(self, m, k, v) -> None:
        self.kept[m.id] = (k, v)
        self.order.append(m.id)

    def take(self, m):
        return self.kept.get(m.id)

    def discard(self, m) -> None:
        self.discarded.append(m.id)


def test_put_and_take_round_trip_and_take_empties():
    tier = HostTier(10_000)
    m = msg(1)
    k, v = kv(3, 1.5)
    tier.put(m, k, v)
    assert tier.tokens == 3 and tier.nbytes == 2 * k.numel() * 4 and tier.ids() == [1]
    got = tier.take(m)
    assert got is not None and torch.equal(got[0], k) and torch.equal(got[1], v)
    assert tier.take(m) is None and tier.tokens == 0 and tier.nbytes == 0


@given(st.lists(st.integers(1, 6), min_size=1, max_size=12), st.integers(0, 800))
def test_within_budget_the_least_recently_put_go_down_first(sizes, budget):
    """Against a list simulation: an encoding larger than the budget goes straight
    down; else the oldest go down until it fits. Same kept order, same order down."""
    below = Recorder()
    tier = HostTier(budget, below)
    kept: list[int] = []
    down: list[int] = []
    size = [64 * n for n in sizes]  # k and v, (2, n, 1, 4) float32 each
    for i, n in enumerate(sizes):
        tier.put(msg(i), *kv(n, float(i)))
        if size[i] > budget:
            down.append(i)
            continue
        while kept and sum(size[j] for j in kept) + size[i] > budget:
            down.append(kept.pop(0))
        kept.append(i)
    assert tier.ids() == kept and below.order == down
    assert tier.nbytes == sum(size[j] for j in kept) <= budget
    for i in kept:
        assert torch.equal(tier.take(msg(i))[0], kv(sizes[i], float(i))[0])


def test_take_falls_through_and_discard_reaches_below():
    below = Recorder()
    tier = HostTier(0, below)  # holds nothing: everything goes down
    m = msg(7)
    tier.put(m, *kv(2, 3.0))
    assert tier.ids() == [] and below.order == [7] and tier.moved_down == 1
    assert torch.equal(tier.take(m)[0], kv(2, 3.0)[0])
    tier.discard(m)
    assert below.discarded == [7]


def test_a_negative_budget_is_refused():
    with pytest.raises(ValueError, match="bytes >= 0"):
        HostTier(-1)


async def crowd(engine):
    """Two messages and a long decode over the second in a store too small for all:
    the first's encoding is evicted, then read back by a short decode."""
    a = await engine.prefill("alpha beta gamma delta " * 2)
    b = await engine.prefill("one two three four five " * 2)
    long = await engine.decode(parents=[b], max_tokens=90, ignore_eos=True)
    back = await engine.decode(parents=[a], max_tokens=8, ignore_eos=True)
    return long.text, back.text


@pytest.mark.parametrize("store", [False, True])
def test_a_crowded_engine_copies_back_from_host_memory(tiny_dirs, tmp_path, store):
    """The host tier under the engine's store (with a store directory below it, or
    not): the evicted encoding comes back from host memory, nothing is recomputed,
    the replies are those of an engine with room, and `Engine.check()` is exact."""

    async def main():
        async with open_tiny(tiny_dirs) as roomy:
            want = await crowd(roomy)
        path = tmp_path / "s" if store else None
        async with open_tiny(tiny_dirs, capacity=180, store=path) as tight:
            memory = tight.executor.memory
            below = memory.tier  # the store's files, or None
            memory.tier = HostTier(1 << 20, below)  # as the engine does under a GPU's store
            got = await crowd(tight)
            s = tight.stats()
            tight.check()
        assert got == want
        assert s.messages_evicted >= 1 and s.tokens_recomputed == 0
        assert s.tokens_copied_back > 0

    anyio.run(main)


async def test_a_freed_message_leaves_the_host_tier(tiny_dirs):
    async with open_tiny(tiny_dirs, capacity=180) as engine:
        memory = engine.executor.memory
        memory.tier = HostTier(1 << 20)
        a = await engine.prefill("alpha beta gamma delta " * 2)
        b = await engine.prefill("one two three four five " * 2)
        await engine.decode(parents=[b], max_tokens=90, ignore_eos=True)  # evicts a
        assert a.id in memory.tier.ids() and engine.stats().tokens_in_host == a.length
        engine.free(a)
        assert memory.tier.ids() == [] and engine.stats().tokens_in_host == 0
        engine.check()


def test_under_a_gpu_store_the_engine_puts_a_host_tier_itself(tiny_dirs):
    """On a GPU (`pytest --device cuda`, `.ci/gpu-check`), an engine puts the host tier
    under its store with no setting, and a crowded one copies back from it."""
    if conftest.DEVICE != "cuda":
        pytest.skip("the engine puts a host tier only under a GPU's store (--device cuda)")

    async def main():
        async with open_tiny(tiny_dirs) as roomy:
            want = await crowd(roomy)
        async with open_tiny(tiny_dirs, capacity=180) as tight:
            assert isinstance(tight.executor.memory.tier, HostTier)
            got = await crowd(tight)
            s = tight.stats()
            tight.check()
        assert got == want and s.tokens_recomputed == 0 and s.tokens_copied_back > 0

    anyio.run(main)
