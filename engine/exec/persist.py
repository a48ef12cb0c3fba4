"""An executor's messages kept in a store (`corps.cache.durable`): read back, saved.

`restore` puts a store's messages back in the table before the engine starts: each
with its id, text, parents and provenance; an encoding saved in the store is
copied into the KV store while it has room (and matches its shape), any other
stays evicted and comes back when a call first reads it (`corps.engine.exec.restorer`):
copied from the store if saved there, else encoded again from its tokens. From
then on the table tells the store of every message made, freed and forgotten, and
the store is the memory's tier: an encoding evicted for room is saved there, not
dropped (`Memory.tier`). `checkpoint` saves the encodings of live messages (as the
engine closes): K, unrotated, and V read from their slots.
"""

from __future__ import annotations

from corps.cache.durable import DurableStore
from corps.engine.exec.memory import Memory


def restore(memory: Memory, store: DurableStore, *, encodings: bool) -> tuple[int, int]:
    """Read `store`'s messages into `memory`'s table and journal to it from now on;
    with `encodings` (choreographed) the store is also the memory's tier, and saved
    encodings are copied in while there is room. Returns (messages read back,
    encodings copied in). Torch thread, before any call."""
    table = memory.table
    stored = store.messages()
    for s in stored:
        if not encodings:  # baseline: every message is text; its prompts are encoded anew
            s.message.evicted = False
    table.restore([s.message for s in stored])
    table.origin = store.origin(table.origin)
    copied = 0
    if encodings:
        memory.tier = store
        for s in stored:
            m = s.message
            if m.evicted and not m.freed and s.kv is not None and memory.copy_back(m):
                copied += 1
    table.journal = store
    return len(stored), copied


def checkpoint(memory: Memory, store: DurableStore) -> int:
    """Save every live message's encoding (and its record, figures included) to
    `store`; records of messages without one are rewritten. Returns encodings saved."""
    saved = 0
    for m in memory.table.all():
        if m.kind == "sink":
            continue
        if m.freed or len(m.slots) != len(m.tokens) or not m.slots:
            store.update(m)
            continue
        if store.has_kv(m.id):  # read back unchanged: its file is still right
            store.update(m)
            continue
        store.save(m, *memory.encoding(m))
        saved += 1
    return saved
