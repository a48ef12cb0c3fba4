"""An executor's messages kept in a store (`corps.cache.durable`): read back, saved.

`restore` puts a store's messages back in the table before the engine starts: each
with its id, text, parents and provenance; an encoding saved in the store is
copied into the KV store while it has room (and matches its shape), any other
stays evicted and comes back when a call first reads it (`corps.engine.exec.restorer`):
copied from the store if saved there, else encoded again from its tokens. From
then on the table tells the store of every message made (its encoding saved with
it: `Keeper`), freed and forgotten, and the store is the memory's tier: an encoding
evicted for room is saved there, not dropped (`Memory.tier`). `checkpoint` (as the
engine closes) saves what is not saved yet and each record's figures.
"""

from __future__ import annotations

from corps.cache.durable import DurableStore
from corps.cache.messages import Message
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
        memory.keep_below(store)
        for s in stored:
            m = s.message
            if m.evicted and not m.freed and s.kv is not None and memory.copy_back(m):
                copied += 1
    table.journal = Keeper(memory, store, encodings=encodings)
    return len(stored), copied


class Keeper:
    """The table's journal with a store: each message's row as it is made, and (with
    encodings) its encoding saved then too, so a process killed after a call ended
    loses nothing that call made: a run resumed (`corps.engine.api.turns`) encodes
    no finished turn again. Freed and forgotten messages go as the store says."""

    def __init__(self, memory: Memory, store: DurableStore, *, encodings: bool) -> None:
        self.memory, self.store, self.encodings = memory, store, encodings

    def added(self, msg: Message) -> None:
        encoded = msg.kind != "sink" and msg.slots and len(msg.slots) == len(msg.tokens)
        if self.encodings and encoded:
            self.store.save(msg, *self.memory.encoding(msg))  # its row with it
        else:  # text only, the sink, or a reply set aside unencoded (`final`)
            self.store.added(msg)

    def freed(self, msg: Message) -> None:
        self.store.freed(msg)

    def forgotten(self, mid: int) -> None:
        self.store.forgotten(mid)


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
