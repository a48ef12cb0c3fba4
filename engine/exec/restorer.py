"""Recomputing evicted encodings (preemption, `corps.engine.exec.memory`).

A message whose encoding was dropped for room keeps its record: its tokens, its
parents, where they sat, and the steps its tokens went through the model in
(`Message.spans`). Before a call reads it, `Restorer.restore` encodes it again: a
prefill-like call over the same parents at the same offsets, whose feed runs in
those same steps (a decode's header, then a token a step, then its last token
with the footer). Same inputs, same row counts: the same K/V, bit for bit in
float32 on a CPU when the steps ran alone both times (on a GPU, to float32
rounding: its kernels depend on the step's shape and on CUDA graphs). A parent
without an encoding (evicted, or freed meanwhile: its record stays while messages
encoded over it remain) is recomputed first; a freed one only to be read, then
given back. With a store (`EngineConfig.store`) an encoding evicted for room was
saved there and is copied back instead, with no model run (`Memory.copy_back`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from corps.cache.handle import Handle
from corps.cache.messages import Message
from corps.engine.exec.call import Call, CallPlan
from corps.engine.exec.counts import Counts
from corps.engine.exec.memory import Memory, Victims
from corps.engine.exec.planner import Planner
from corps.engine.exec.repairs import Repairs
from corps.engine.repair import parse_repair


class Restorer:
    """Encodes evicted messages again before a call reads them."""

    def __init__(
        self,
        memory: Memory,
        planner: Planner,
        repairs: Repairs,
        run_alone: Callable[[Call], None],
        counts: Counts,
    ) -> None:
        self.memory, self.table, self.planner = memory, memory.table, planner
        self.repairs, self.run_alone, self.counts = repairs, run_alone, counts

    def restore(self, parents: Sequence[Handle], evict: Victims | None = None) -> None:
        """Recompute the encodings of evicted messages among `parents` (and of any
        message without one that they were encoded over) before a call reads them.
        Parents are pinned meanwhile, so making room for one never drops another."""
        own = [h for h in parents if isinstance(h, Handle) and h.table is self.table]
        msgs = [m for h in own if (m := self.table.find(h.id)) is not None]
        if not any(m.evicted and not m.freed for m in msgs):
            return
        memory = self.memory
        memory.pin(msgs)
        made: list[Message] = []
        try:
            for m in msgs:
                if m.evicted and not m.freed:
                    self._recompute(m, evict, made)
        finally:
            memory.unpin(msgs)
            _release_unread(memory, made)

    def _recompute(self, m: Message, evict: Victims | None, made: list[Message]) -> None:
        """Encode m again over its parents (recomputed first where they have no
        encoding), step for step as it was first encoded; `made` collects freed
        messages recomputed only to be read."""
        memory = self.memory
        if memory.copy_back(m, evict):  # saved in the store's tier: no model run
            if m.freed:
                made.append(m)
            return
        held: list[Message] = []
        try:
            for pid in m.parents:
                p = self.table.get(pid)
                if not p.slots:
                    self._recompute(p, evict, made)
                memory.pin([p])
                held.append(p)
            call = self.call_of(m)
            repair = parse_repair(m.repair or None)
            try:
                memory.reserve(call, 0, evict)
                memory.gather(call, len(call.feed), own=not repair.none)
                if not repair.none:  # its context repaired as when it was first encoded
                    call.repair = self.repairs.plan(call, repair)
                self.run_alone(call)
            except BaseException:
                memory.abort(call)
                raise
            with memory.lock:
                m.slots, call.slots = call.slots, []
                m.evicted = False
            memory.unpin_call(call)
            memory.drop_view(call)
            self.counts.tokens_recomputed += len(m.tokens)
            if m.freed:
                made.append(m)
        finally:
            memory.unpin(held)

    def call_of(self, m: Message) -> Call:
        """A call that encodes m's tokens again over its parents at their offsets, in
        the steps it was first encoded in."""
        parents = tuple(self.table.get(p) for p in m.parents)
        ctx_slots, ctx_pos = self.planner.context(parents, m.parent_offsets)
        plan = CallPlan(
            kind="prefill",
            role=m.role,
            offset=m.offset,
            parents=m.parents,
            parent_offsets=m.parent_offsets,
            owner=m.owner,
            visibility=m.visibility,
            own=len(m.tokens),
            prefix=list(m.tokens),
            records=parents,
        )
        call = Call(plan, ctx_slots, ctx_pos, list(m.tokens), m.offset, first_spans=m.spans)
        call.adapted = self.repairs.adapted(plan)  # as when it was first encoded
        return call


def _release_unread(memory: Memory, msgs: list[Message]) -> None:
    """Give back the slots of freed messages recomputed only to be read that no call
    pins any more."""
    with memory.lock:
        for m in msgs:
            if m.freed and m.pins == 0 and m.slots:
                memory.release(m)
