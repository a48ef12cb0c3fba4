"""The memory manager: KV slots, reservations, pins, views and rollback of one engine.

A call's slots are reserved when it is admitted (its feed now, and every token it
may generate up front, so it never runs out mid-generation); its parents are
pinned while it runs, so a `free` in between waits for it. A failed call gives
everything back (`rollback`), so the store is as if it never ran. The baseline's
cached prefixes (`PrefixSharing`) own slots too: they are evicted when the store
runs short.

Preemption (choreographed mode): when a call cannot get slots and nothing running
will give any back, the scheduler admits it again with a victim order (`Victims`,
the policy's choice): the encodings of live messages that no running call reads
are dropped (`evict`), least wanted first, until the call fits. Such a message
stays readable (text, tokens, provenance); the next call that names it as a
parent recomputes its encoding first (`corps.engine.exec.restorer`), by running its tokens
through the model again in the steps it was first encoded in, over the same
parents at the same offsets: the same K/V, bit for bit in float32 on a CPU when
those steps had the same rows (on a GPU, to float32 rounding).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, TypeAlias

import torch
from torch import Tensor

from corps.cache.arena import ViewArena
from corps.cache.context import ContextPool
from corps.cache.errors import CacheFullError, StoreTooSmall, require
from corps.cache.handle import Handle
from corps.cache.host_tier import HostTier
from corps.cache.kv import KVStore
from corps.cache.messages import Message, MessageTable
from corps.cache.rope import RopeTables
from corps.engine.attention.views import context_key, open_view
from corps.engine.errors import InvalidRequest
from corps.engine.exec.call import Call
from corps.engine.exec.prefixes import PrefixSharing

#: Orders eviction candidates, first to go first (a scheduling policy's `victims`).
Victims: TypeAlias = Callable[[list[Message]], list[Message]]


class Tier(Protocol):
    """Where evicted encodings are kept instead of dropped (`corps.cache.durable`)."""

    def put(self, m: Message, k: Tensor, v: Tensor) -> None: ...
    def take(self, m: Message) -> tuple[Tensor, Tensor] | None: ...
    def discard(self, m: Message) -> None: ...


class Memory:
    """The store, the view arena (and scratch) and who holds what in them."""

    def __init__(
        self,
        store: KVStore,
        arena: ViewArena,
        scratch: ViewArena | None,
        table: MessageTable,
        rope: RopeTables,
        fill: Callable | None,
        *,
        shared_prefixes: bool,
    ) -> None:
        self.store, self.arena, self.scratch = store, arena, scratch
        self.table, self.rope, self._fill = table, rope, fill
        self.contexts = ContextPool()  # rotated contexts, each once for all its readers
        # Guards slot and pin bookkeeping: `free` runs on the caller's thread while a
        # call may be running on the worker thread.
        self.lock = threading.RLock()
        self.prefixes = PrefixSharing(store, self.lock) if shared_prefixes else None
        self.own_view_tokens = 0  # tokens of admitted calls' own view parts
        self.view_tokens_peak = 0
        self.scratch_tokens_peak = 0
        self.tick = 0  # counts pins: a message's read_at says when a call last read it
        self.messages_evicted = 0
        self.tokens_evicted = 0
        # where evicted encodings go instead of nowhere (`EngineConfig.store`: its files),
        # and come back from by copy (`copy_back`); None: they are recomputed when read
        self.tier: Tier | None = None
        self.tokens_copied_back = 0
        self.tokens_prefetched = 0  # of those, copied back ahead of their readers (`prefetch`)

    # ---- reserving and giving back ----

    def check_fits(self, c: Call, prompt: int, generated: int) -> None:
        """StoreTooSmall if the call could not run even in an otherwise empty store."""
        need = prompt + generated  # store slots, and view tokens alike
        room, where = min((self.store.capacity, "store"), (self.arena.capacity, "view arena"))
        if need > room:
            raise StoreTooSmall(
                f"this {c.plan.kind} call needs {need} token slots (prompt {prompt} + up to "
                f"{need - prompt} generated) but the whole {where} has {room}; "
                f"lower max_tokens or open the engine with a larger capacity / memory_budget"
            )

    def reserve(self, c: Call, generated: int, evict: Victims | None = None) -> None:
        """Pin c's parents (`Call.pins`, unless it holds them from its submission),
        reuse a cached prefix (baseline) and reserve slots for its feed and the
        `generated` tokens it may add; with `evict`, drop encodings no running call
        reads if that is what it takes."""
        with self.lock:
            self.tick += 1
            for p in c.plan.records:
                p.read_at = self.tick
            if not c.pins:
                c.pins = self.pin(c.plan.records)
            if self.prefixes is not None:
                self.prefixes.match(c)
            n = len(c.feed)
            request = f"a {n}-token {c.plan.kind} call (+{generated} to generate)"
            got = self.alloc(n + generated, request, evict)
            c.slots, c.spare = got[:n], got[n:]

    def gather(self, c: Call, extra: int, own: bool = False, tag: tuple | None = None) -> None:
        """c's view: its context rotated (or read from the store) plus room for `extra`.
        `own`: a context of its own, copied, shared with no one (a repaired call
        rewrites some of it, `corps.engine.exec.repairs`). `tag`: a copied context
        shared only by the calls that give the same tag (those that repair it alike);
        the first of them builds it (`c.view.built`)."""
        private = own and tag is None
        c.view = open_view(
            self.store,
            self.rope,
            c.ctx_slots,
            c.ctx_pos,
            extra,
            self.arena,
            fill=self._fill,
            pool=None if private else self.contexts,
            scratch=None if own or tag is not None else self.scratch,
            tag=tag or (),
        )
        with self.lock:
            self.own_view_tokens += c.view.capacity
            self.view_tokens_peak = max(self.view_tokens_peak, self.view_tokens)
            self.scratch_tokens_peak = max(self.scratch_tokens_peak, self.scratch_tokens)

    def being_written(self, c: Call, tag: tuple) -> bool:
        """Whether the live context c would share under `tag` is still being written
        by the call that built it (its repair has rows left): c reads it once whole.
        If so, the context is marked awaited, so its writer keeps it for c even if
        its reply is final (`Call.awaited`)."""
        ctx = self.contexts.peek(context_key(c.ctx_slots, c.ctx_pos, tag))
        waits = ctx is not None and ctx.writer is not None and not ctx.writer.repair_done
        if waits:  # its writer keeps it until they have joined (`Call.awaited`)
            ctx.awaited = True
        return waits

    def alloc(self, n: int, request: str, evict: Victims | None = None) -> list[int]:
        with self.lock:
            short = n - self.store.free_slots
            if short > 0 and self.prefixes is not None:
                self.store.release(self.prefixes.evict(short))
                short = n - self.store.free_slots
            if short > 0 and evict is not None:
                self.evict(short, evict)
            return self.store.alloc(n, request=request)

    def evict(self, n: int, order: Victims) -> int:
        """Drop the encodings of live, unpinned, recomputable messages, first in
        `order` first, until n slots are free; none if they cannot make n. Returns the
        slots freed."""
        with self.lock:
            candidates = [m for m in self.table.all() if _evictable(m)]
            victims, got = [], 0
            for m in order(candidates):
                if got >= n:
                    break
                victims.append(m)
                got += len(m.slots)
            if got < n:
                return 0
            for m in victims:
                if self.tier is not None:
                    self.tier.put(m, *self.encoding(m))
                self.release(m)
                m.evicted = True
            self.messages_evicted += len(victims)
            self.tokens_evicted += got
            return got

    def encoding(self, m: Message) -> tuple[Tensor, Tensor]:
        """m's K (unrotated) and V, read from its slots: (L, n, Hkv, D) each."""
        idx = torch.tensor(m.slots, device=self.store.k.device)
        return self.store.k.index_select(1, idx), self.store.v.index_select(1, idx)

    def copy_back(self, m: Message, evict: Victims | None = None) -> bool:
        """Put evicted m's encoding back from the tier, by copy; False if the tier has
        none (or none of m's shape), or the store has no room: m is recomputed then."""
        got = None if self.tier is None else self.tier.take(m)
        kv = self.store.k
        want = (kv.shape[0], len(m.tokens), *kv.shape[2:])  # (L, n, Hkv, D)
        if got is None or got[0].shape != want or got[1].shape != want:
            return False
        try:
            slots = self.alloc(len(m.tokens), "an evicted message", evict)
        except CacheFullError:
            self.tier.put(m, *got)  # kept where it was (a store's file: already there)
            return False
        idx = torch.tensor(slots, device=kv.device)
        with self.lock:
            self.store.k.index_copy_(1, idx, got[0].to(kv))
            self.store.v.index_copy_(1, idx, got[1].to(kv))
            m.slots, m.evicted = slots, False
            self.tokens_copied_back += len(slots)
        return True

    def keep_below(self, tier: Tier) -> None:
        """`tier` (a store's files) under the tier in place (a GPU store's host tier,
        `corps.cache.host_tier`), or as the only one."""
        if isinstance(self.tier, HostTier):
            self.tier.below = tier
        else:
            self.tier = tier

    def prefetch(self, ids: Iterable[int]) -> int:
        """Copy back from the tier the evicted encodings of these messages that fit in
        the store's free slots now, evicting nothing (`corps.engine.sched.next_reads`);
        tokens copied. Without a tier, nothing (they are recomputed when read)."""
        if self.tier is None:
            return 0
        got = 0
        for mid in sorted(ids):
            m = self.table.find(mid)
            if m is None or m.freed or not m.evicted or len(m.tokens) > self.store.free_slots:
                continue
            if self.copy_back(m):
                got += len(m.tokens)
        self.tokens_prefetched += got
        return got

    def use_host_tier(self) -> None:
        """Under a GPU's store (choreographed), evicted encodings go to page-locked host
        memory first (`corps.cache.host_tier`): as many bytes as the store holds, at
        most a quarter of the host memory free now."""
        free = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
        held = self.store.capacity * self.store.bytes_per_slot
        self.tier = HostTier(min(held, free // 4), pin=True)

    def in_host(self) -> int:
        """Tokens whose evicted encodings the host tier holds now (0 without one)."""
        return self.tier.tokens if isinstance(self.tier, HostTier) else 0

    def spilled(self) -> int:
        """Tokens of live messages whose encodings are evicted now (`EngineStats`)."""
        return sum(len(m.tokens) for m in self.table.all() if m.evicted and not m.freed)

    def next_slots(self, c: Call, n: int) -> None:
        """n more store slots for the call's next tokens: its reservation first."""
        take = min(n, len(c.spare))
        if take:
            c.slots += reversed(c.spare[len(c.spare) - take :])
            del c.spare[len(c.spare) - take :]
        if n > take:
            c.slots += self.alloc(n - take, "a next token")

    def release_spare(self, c: Call) -> None:
        if c.spare:
            with self.lock:
                self.store.release(c.spare)
                c.spare = []

    def drop_view(self, c: Call) -> None:
        if c.view is not None:
            with self.lock:
                c.view.release()
                self.own_view_tokens -= c.view.capacity
            c.view = None

    def rollback(self, c: Call, keep_pins: bool = False) -> None:
        """Give back every slot, lock and pin c holds (its pins kept with `keep_pins`:
        an admission that failed, of a call still queued); its view stays."""
        with self.lock:
            if c.slots:
                self.store.release(c.slots[c.cached :])  # the tree owns the cached ones
                c.slots = []
            if c.spare:
                self.store.release(c.spare)
                c.spare = []
            if self.prefixes is not None:
                self.prefixes.rollback(c)
            if not keep_pins:
                self.unpin_call(c)

    def abort(self, c: Call, keep_pins: bool = False) -> None:
        """Give back everything a call holds (but its pins, with `keep_pins`); the store
        is as if it never ran."""
        self.rollback(c, keep_pins)
        self.drop_view(c)
        c.mark_done()

    # ---- pins and frees ----

    def pin(self, items: Sequence[Handle | Message]) -> list[Message]:
        """Keep these messages' encodings until `unpin`, even if freed meanwhile: by
        handle (a live message, else UnknownHandle) or as records already looked up."""
        with self.lock:
            msgs = [x if isinstance(x, Message) else self.table.live(x.id) for x in items]
            for m in msgs:
                m.pins += 1
            return msgs

    def unpin(self, msgs: Sequence[Message]) -> None:
        with self.lock:
            for m in msgs:
                m.pins -= 1
                if m.freed and m.pins == 0:
                    self.release(m)

    def unpin_call(self, c: Call) -> None:
        """The pins c holds (`Call.pins`), given back once."""
        with self.lock:
            pins, c.pins = c.pins, []
            self.unpin(pins)

    def free(self, msg: Message) -> None:
        """Mark a message freed; its slots go now, or when the last call reading it ends."""
        with self.lock:
            msg.freed = True
            if msg.pins == 0:
                self.release(msg)
            if msg.evicted and self.tier is not None:
                self.tier.discard(msg)  # its kept copy goes with it
        self.table.freed(msg)

    def set_aside(self, msg: Message) -> None:
        """Give back the slots of an encoding no call is expected to read (a final
        reply): evicted, so a call that does read it has it recomputed first. Not
        counted as eviction (no memory pressure made it)."""
        with self.lock:
            self.release(msg)
            msg.evicted = True

    def release(self, msg: Message) -> None:
        self.store.release(msg.slots)
        msg.slots = []

    # ---- figures ----

    @property
    def view_tokens(self) -> int:
        """Tokens held in views: every live context once, plus each call's own part."""
        return self.own_view_tokens + self.contexts.tokens

    @property
    def scratch_tokens(self) -> int:
        """Tokens of one layer that contexts read from the store hold (contexts="store")."""
        s = self.scratch
        return s.capacity - s.free_tokens if s is not None else 0

    def reset_peaks(self) -> None:
        """Peaks start over from what is held now (`Engine.reset_peak_stats`)."""
        with self.lock:
            self.view_tokens_peak = self.view_tokens
            self.scratch_tokens_peak = self.scratch_tokens

    @property
    def kv_bytes(self) -> int:
        """All the KV memory the engine can use: the store, the view arena and the
        one-layer context scratch (contexts="store")."""
        per = self.store.bytes_per_slot
        scratch = self.scratch.capacity * per // self.store.k.shape[0] if self.scratch else 0
        return (self.store.capacity + self.arena.capacity) * per + scratch

    def drop(self) -> None:
        """Give the store's, the arena's, the scratch's and the RoPE tables' tensors back
        (the engine closed)."""
        self.store.drop()
        self.arena.drop()
        if self.scratch is not None:
            self.scratch.drop()
        self.rope = None

    def check(self) -> None:
        """BrokenInvariant unless the bookkeeping of an idle engine is exact: every used
        slot has one owner (a live or pinned message, or the radix tree) and the free
        list holds the rest once; no pins, arena ranges or radix locks are left."""
        owned: list[int] = []
        for msg in self.table.all():
            require(msg.pins == 0, f"message {msg.id} still pinned while idle")
            require(not msg.freed or not msg.slots, f"freed message {msg.id} still holds slots")
            require(not msg.evicted or not msg.slots, f"evicted message {msg.id} holds slots")
            owned += msg.slots
        if self.prefixes is not None:
            owned += self.prefixes.check_idle()
        self.store.check(owned)
        if isinstance(self.tier, HostTier):  # it holds only encodings out of the store
            for mid in self.tier.ids():
                m = self.table.find(mid)
                require(m is not None and m.evicted and not m.freed,
                        f"the host tier holds message {mid}, which is not evicted")  # fmt: skip
        self.arena.check_idle()
        require(self.view_tokens == 0, f"{self.view_tokens} view tokens still held while idle")


def _evictable(m: Message) -> bool:
    """A live encoding no call reads now, which its record can make again."""
    return not m.freed and not m.pins and bool(m.slots) and m.recomputable


def scratch_arena(dims: dict, attention: str) -> ViewArena:
    """The one-layer scratch of contexts="store" (`EngineConfig.contexts`): each live
    context's rotated keys of the layer being run. Needs the torch attention backend."""
    if attention != "torch":
        raise InvalidRequest(
            f'contexts="store" needs the torch attention backend, not {attention!r} '
            "(set attention='torch')"
        )
    return ViewArena(**{**dims, "num_layers": 1})
