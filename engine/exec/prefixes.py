"""The baseline's prefix reuse: a radix tree of encoded prompts, shared in-batch.

A baseline call re-encodes its parents' text as one causal prompt; the longest
cached prefix of that prompt comes from the radix tree (`match`). A call's
prompt is cached as soon as a chunk of it is encoded (`cache_fed`), so a call
whose prompt shares HOLD_MIN_SHARED or more uncached tokens with a running
call's prompt waits for it (`waits`) and reuses it, as SGLang does for requests
that arrive together. A finished call caches its prompt and output but its last
token (`cache`); a failed one takes back what it inserted once nobody reads it.
"""

from __future__ import annotations

import itertools
import threading

from corps.cache.errors import require
from corps.cache.kv import KVStore
from corps.cache.radix import RadixCache
from corps.engine.exec.call import Call

#: A call waits for a running call's prompt when they share at least this many
#: tokens nobody has encoded yet (SGLang's in-batch threshold is 32 too).
HOLD_MIN_SHARED = 32


class PrefixSharing:
    """The radix tree of one baseline engine and the calls filling it."""

    def __init__(self, store: KVStore, lock: threading.RLock) -> None:
        self.store = store
        self.radix = RadixCache()
        self._lock = lock  # the memory manager's: slots move between tree and calls
        self._uids = itertools.count(1)
        self._filling: list[Call] = []  # calls whose prompt is not all cached yet
        self._running: set[int] = set()  # uids of admitted, unfinished calls
        self._failed: set[int] = set()  # failed calls whose inserts are still read
        self.shared_in_batch = 0  # hit tokens that a still-running call had encoded

    def match(self, c: Call) -> None:
        """Point c's context at the longest cached prefix of its prompt; lock it."""
        match = self.radix.match(c.plan.prefix, salt=c.plan.salt)
        hit = min(match.length, len(c.plan.prefix) - 1)  # re-encode >= 1 token to get logits
        if c.want_logits:  # every own token's logits are wanted: encode them all
            hit = min(hit, len(c.plan.prefix) - c.plan.own)
        self.radix.lock(match.node)
        c.lock = match.node
        c.ctx_slots, c.ctx_pos = match.slots[:hit], list(range(hit))
        c.feed, c.feed_start = c.plan.prefix[hit:], hit
        seen = 0
        for creator, n in match.creators:  # hits a call still running encoded: in-batch
            if creator in self._running:
                self.shared_in_batch += max(0, min(n, hit - seen))
            seen += n
        c.uid = next(self._uids)
        self._running.add(c.uid)
        self._filling.append(c)

    def waits(self, c: Call) -> bool:
        """Whether c should wait for a running call that is encoding its prompt's prefix.
        Only calls still encoding their prompt are waited for, so a hold always ends."""
        if not self._filling:
            return False
        cached = self.radix.peek(c.plan.prefix, c.plan.salt)
        return any(
            _common_len(c.plan.prefix, other.plan.prefix) - cached >= HOLD_MIN_SHARED
            for other in self._filling
            if other.plan.salt == c.plan.salt
        )

    def cache_fed(self, c: Call) -> None:
        """Put the prompt tokens c has encoded so far in the tree, for others to reuse.

        The tree owns those slots from now on (c keeps them locked while it runs);
        slots that another call had already cached are given back.
        """
        with self._lock:
            end = c.feed_start + c.fed
            tokens, slots = c.plan.prefix[:end], c.ctx_slots + c.slots[: c.fed]
            salt = c.plan.salt
            self.store.release(self.radix.insert(tokens, slots, creator=c.uid, salt=salt))
            match = self.radix.match(tokens, count=False, salt=salt)
            self.radix.lock(match.node)
            self.radix.unlock(c.lock)
            c.lock = match.node
            c.slots[: c.fed] = match.slots[len(c.ctx_slots) :]
            c.cached = c.fed
            if c.fed == len(c.feed):
                self._filling.remove(c)

    def cache(self, c: Call, tokens: list[int]) -> None:
        """c finished: its `tokens` (prompt, and output but its last token) go in the
        tree, which owns their slots from now on."""
        with self._lock:
            slots = c.ctx_slots + c.slots
            dup = self.radix.insert(tokens, slots, creator=c.uid or None, salt=c.plan.salt)
            self.store.release(dup)
            self.radix.unlock(c.lock)
            c.lock, c.slots = None, []
            self._end(c, failed=False)

    def rollback(self, c: Call) -> None:
        """c failed: unlock what it read, take back what it inserted (once unread)."""
        with self._lock:
            if c.lock is not None:
                self.radix.unlock(c.lock)
                c.lock = None
            if c.uid:
                self._end(c, failed=True)

    def _end(self, c: Call, *, failed: bool) -> None:
        """c is over: it no longer fills or shares. A failed call takes back what it
        inserted, except what a running call still reads: that goes when it is free."""
        if c in self._filling:
            self._filling.remove(c)
        self._running.discard(c.uid)
        if failed:
            self._failed.add(c.uid)
        for uid in list(self._failed):
            self.store.release(self.radix.drop(uid))
            if not self.radix.holds(uid):
                self._failed.discard(uid)
        c.uid = 0

    def evict(self, n: int) -> list[int]:
        """Slots of up to `n` unlocked cached tokens, least recently used first."""
        return self.radix.evict(n)

    def check_idle(self) -> list[int]:
        """BrokenInvariant unless no call fills the tree and nothing is locked; returns
        the store slots the tree owns."""
        require(not self._filling and not self._running, "a baseline call still runs")
        return self.radix.check_idle()


def _common_len(a: list[int], b: list[int]) -> int:
    n, limit = 0, min(len(a), len(b))
    while n < limit and a[n] == b[n]:
        n += 1
    return n
