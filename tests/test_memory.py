"""engine/exec/memory.py: reservations, pins and rollback leave the store exactly as it was."""

from __future__ import annotations

import pytest
import torch

from corps.cache.arena import ViewArena
from corps.cache.errors import BrokenInvariant, StoreTooSmall
from corps.cache.handle import Handle
from corps.cache.kv import KVStore
from corps.cache.messages import Message, MessageTable
from corps.cache.rope import RopeTables
from corps.engine.exec.call import Call, CallPlan
from corps.engine.exec.memory import Memory

DIMS = dict(num_layers=1, num_kv_heads=1, head_dim=4, dtype=torch.float32)


def _memory(capacity: int = 32) -> Memory:
    store = KVStore(capacity=capacity, **DIMS)
    arena = ViewArena(capacity=capacity, **DIMS)
    rope = RopeTables(torch.ones(64, 4), torch.zeros(64, 4))
    return Memory(store, arena, None, MessageTable(), rope, None, shared_prefixes=False)


def _message(mem: Memory, n: int) -> Message:
    table = mem.table
    mid = table.next_id()
    table.add(Message(mid, list(range(n)), "", "user", "prefill", mem.alloc(n, "t"), 0, (), ()))
    return table.get(mid)


def _call(parents: list[Message], feed: int) -> Call:
    plan = CallPlan(
        kind="prefill",
        role="user",
        offset=0,
        parents=tuple(p.id for p in parents),
        parent_offsets=(),
        owner=None,
        visibility=None,
        own=feed,
        prefix=list(range(feed)),
        records=tuple(parents),
    )
    return Call(
        plan,
        ctx_slots=[s for p in parents for s in p.slots],
        ctx_pos=list(range(sum(len(p.slots) for p in parents))),
        feed=list(range(feed)),
        feed_start=0,
    )


def test_a_rolled_back_call_leaves_the_store_as_it_was():
    mem = _memory()
    parent = _message(mem, 5)
    before = mem.store.free_slots
    c = _call([parent], feed=3)
    mem.reserve(c, generated=4)
    mem.gather(c, 3 + 4)
    assert mem.store.free_slots == before - 7 and parent.pins == 1 and mem.view_tokens > 0
    mem.next_slots(c, 2)  # from its reservation first
    assert len(c.slots) == 5 and len(c.spare) == 2 and mem.store.free_slots == before - 7
    mem.rollback(c)
    mem.drop_view(c)
    assert mem.store.free_slots == before and parent.pins == 0 and mem.view_tokens == 0
    mem.check()


def test_a_freed_message_keeps_its_slots_while_a_call_reads_it():
    mem = _memory()
    parent = _message(mem, 4)
    free0 = mem.store.free_slots
    pins = mem.pin([Handle(parent.id, mem.table)])
    mem.free(parent)
    assert parent.freed and parent.slots and mem.store.free_slots == free0
    mem.unpin(pins)
    assert parent.slots == [] and mem.store.free_slots == free0 + 4
    mem.check()


def test_a_call_that_could_never_fit_is_refused():
    mem = _memory(capacity=16)
    with pytest.raises(StoreTooSmall, match="needs 20 token slots"):
        mem.check_fits(_call([], 4), prompt=4, generated=16)


def test_check_finds_a_slot_with_two_owners():
    mem = _memory()
    a = _message(mem, 3)
    mem.store.release(a.slots[:1])  # a bug: the slot is free and still a's
    with pytest.raises(BrokenInvariant, match="also free"):
        mem.check()


# ---- preemption: evicting encodings no call reads ----


def _recorded(mem: Memory, n: int) -> Message:
    """A message whose steps were recorded (so it can be made again)."""
    m = _message(mem, n)
    m.spans = (n,)
    return m


def test_evict_drops_least_recent_unpinned_live_encodings_until_enough():
    mem = _memory(capacity=32)
    old, pinned, freed_m, new = (_recorded(mem, 4) for _ in range(4))
    old.read_at, new.read_at = 1, 5
    pinned.pins = 1
    mem.free(freed_m)
    from corps.engine.sched.policies import least_recent

    assert mem.evict(3, least_recent) == 4  # one message is enough: the older one
    assert old.evicted and not old.slots and new.slots and not new.evicted
    assert pinned.slots and not pinned.evicted  # read by a running call
    assert mem.messages_evicted == 1 and mem.tokens_evicted == 4
    pinned.pins = 0
    mem.check()


def test_evict_takes_nothing_if_it_cannot_make_enough_room():
    mem = _memory(capacity=32)
    a, b = _recorded(mem, 4), _recorded(mem, 4)
    unrecorded = _message(mem, 4)  # no spans: its encoding could not be made again
    free = mem.store.free_slots
    from corps.engine.sched.policies import least_recent

    assert mem.evict(9, least_recent) == 0
    assert mem.store.free_slots == free and a.slots and b.slots and unrecorded.slots
    assert not (a.evicted or b.evicted)
