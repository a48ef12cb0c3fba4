"""An executor's messages kept in a store (`corps.cache.durable`): read back, saved.

`restore` puts a store's messages back in the table before the engine starts: each
with its id, text, parents and provenance; an encoding saved in the store is
copied into the KV store when it has room (and matches its shape), any other stays
evicted and is encoded again from its tokens when a call first reads it, as after
preemption (`corps.engine.exec.restorer`). From then on the table tells the store of
every message made, freed and forgotten. `checkpoint` saves the encodings of live
messages (as the engine closes): K, unrotated, and V read from their slots.
"""

from __future__ import annotations

import torch

from corps.cache.durable import DurableStore
from corps.cache.errors import CacheFullError
from corps.engine.exec.memory import Memory


def restore(memory: Memory, store: DurableStore, *, encodings: bool) -> tuple[int, int]:
    """Read `store`'s messages into `memory`'s table and journal to it from now on;
    copy saved encodings in where `encodings` (choreographed) and there is room.
    Returns (messages read back, encodings copied in). Torch thread, before any call."""
    table, kv = memory.table, memory.store
    stored = store.messages()
    for s in stored:
        if not encodings:  # baseline: every message is text; its prompts are encoded anew
            s.message.evicted = False
    table.restore([s.message for s in stored])
    table.origin = store.origin(table.origin)
    copied = 0
    for s in stored:
        m = s.message
        if not (encodings and m.evicted and not m.freed and s.kv is not None):
            continue
        got = store.load_kv(s.kv)
        want = (kv.k.shape[0], len(m.tokens), *kv.k.shape[2:])  # (L, n, H, D)
        if got is None or got[0].shape != want or got[1].shape != want:
            continue  # damaged or of other shapes: encoded again when read
        try:
            slots = memory.alloc(len(m.tokens), "a stored message")
        except CacheFullError:
            break  # the rest stay evicted: encoded again when read
        idx = torch.tensor(slots, device=kv.k.device)
        with memory.lock:
            kv.k.index_copy_(1, idx, got[0].to(kv.k))
            kv.v.index_copy_(1, idx, got[1].to(kv.v))
            m.slots, m.evicted = slots, False
        copied += 1
    table.journal = store
    return len(stored), copied


def checkpoint(memory: Memory, store: DurableStore) -> int:
    """Save every live message's encoding (and its record, figures included) to
    `store`; records of messages without one are rewritten. Returns encodings saved."""
    kv, saved = memory.store, 0
    for m in memory.table.all():
        if m.kind == "sink":
            continue
        if m.freed or len(m.slots) != len(m.tokens) or not m.slots:
            store.update(m)
            continue
        if store.has_kv(m.id):  # read back unchanged: its file is still right
            store.update(m)
            continue
        idx = torch.tensor(m.slots, device=kv.k.device)
        store.save(m, kv.k.index_select(1, idx), kv.v.index_select(1, idx))
        saved += 1
    return saved
