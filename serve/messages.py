"""The messages `corps serve` made, by tenant: what a resent message is found by, the
opaque ids clients name them by, and the rollback of a request that failed.

Every prompt message and reply the server encodes is kept here (the least recently
used freed past `size` messages, or past `tokens` of the store's slots: kept
messages never fill the store, where new calls would wait for running ones to end
before anything is evicted), found again by (owner, visibility, the ids it attends to,
where, role, text): a client that resends a conversation reuses its encodings.
The owner names the tenant, so nothing is found across tenants.

Over HTTP a message is named by an opaque id (`msg_` and 128 random bits), valid
only for its tenant: another tenant's id, a guessed one and a freed one are all
"no such message".

A message a request encodes is *claimed* by it until the request ends: kept if
the request (or another that found it meanwhile) succeeded, freed if every
request that claimed it failed. So a refused or cut request leaves the store as
it found it, while concurrent requests bringing the same new message still
encode it once.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

import anyio

from corps.cache.errors import UnknownHandle
from corps.cache.handle import Handle
from corps.cache.visibility import Private


@dataclass(eq=False)
class Kept:
    key: tuple
    handle: Handle
    tenant: str
    public_id: str
    claims: int = 0  # requests using it that have not ended
    committed: bool = False  # a request that used it succeeded


#: the share of the store's slots the server's kept messages may hold at most
KEEP_SHARE = 0.5


class MessageCache:
    def __init__(self, engine, size: int = 4096, tokens: int | None = None) -> None:
        self.engine, self.size, self.budget = engine, size, tokens  # tokens: None, no bound
        self._tokens = 0  # slots its owned messages hold
        self._owned: OrderedDict[int, Kept] = OrderedDict()  # by message id, LRU first
        self._by_key: dict[tuple, Kept] = {}
        self._by_public: dict[str, Kept] = {}
        self._encoding: dict[tuple, anyio.Event] = {}  # keys being encoded now
        # with `corps serve --store`: ids and keys outlive the process (`names`)
        self.durable = engine.store

    @staticmethod
    def key(
        owner: str, parents: list[Handle], offsets: list, role: str, text: str,
        private: bool = False,
    ) -> tuple:  # fmt: skip
        return (owner, private, tuple(h.id for h in parents), tuple(offsets), role, text)

    def find(self, tenant: str, public_id: str) -> Handle | None:
        """The live message `public_id` names for `tenant` (None: no such message)."""
        kept = self._by_public.get(public_id)
        if kept is None or kept.tenant != tenant or kept.handle.freed:
            return None
        self._owned.move_to_end(kept.handle.id)
        return kept.handle

    def claim(self, handle: Handle) -> None:
        """A request reads `handle` (found by `find`) until it releases it."""
        self._owned[handle.id].claims += 1

    def public_id(self, handle: Handle) -> str | None:
        """The opaque id clients name `handle` by (None: no longer kept)."""
        kept = self._owned.get(handle.id)
        return kept.public_id if kept is not None else None

    async def encode(
        self, role: str, text: str, parents: list[Handle], offsets: list, owner: str,
        tenant: str, private: bool = False,
    ) -> tuple[Handle, bool]:  # fmt: skip
        """The message's handle, encoded now or found, claimed by the caller (give it
        back with `release`); and whether it was found."""
        key = self.key(owner, parents, offsets, role, text, private)
        if key in self._encoding:  # a request beside this one is encoding it: share it
            await self._encoding[key].wait()
        found = self._by_key.get(key)
        if found is not None and not found.handle.freed:
            self._owned.move_to_end(found.handle.id)
            found.claims += 1
            return found.handle, True
        given = offsets if any(o is not None for o in offsets) else None
        visibility = Private() if private else None
        self._encoding[key] = done = anyio.Event()
        try:
            handle = await self.engine.prefill(
                text, role=role, parents=list(parents), offsets=given, owner=owner,
                visibility=visibility, tenant=tenant,
            )  # fmt: skip
            self.keep(key, handle, tenant, committed=False, claims=1)
        finally:
            del self._encoding[key]
            done.set()
        return handle, False

    def keep(
        self, key: tuple, handle: Handle, tenant: str, *, committed: bool = True, claims: int = 0
    ) -> Kept:
        """Own `handle` (freed when it is the least recently used past `size` and not
        claimed), find it by `key` and by a new opaque id from now on."""
        kept = Kept(key, handle, tenant, f"msg_{secrets.token_hex(16)}", claims, committed)
        if handle.id not in self._owned:
            self._tokens += handle.length
        self._by_key[key] = kept
        self._by_public[kept.public_id] = kept
        self._owned[handle.id] = kept
        if committed:
            self._name(kept)
        self._evict()
        return kept

    def restore(self) -> int:
        """Take back the messages a server on the same store kept (`--store`): each id
        names its message for its tenant again. Returns how many."""
        if self.durable is None:
            return 0
        for name, mid, tenant, key in self.durable.names():
            try:
                handle = self.engine.handle(mid)
                key = (key[0], bool(key[1]), tuple(key[2]), tuple(key[3]), key[4], key[5])
            except (UnknownHandle, IndexError, TypeError):  # freed, or a damaged key
                self.durable.unname(name)
                continue
            kept = Kept(key, handle, tenant, name, committed=True)
            self._tokens += handle.length
            self._by_key[key] = self._by_public[name] = self._owned[handle.id] = kept
        return len(self._owned)

    def _name(self, kept: Kept) -> None:
        """Keep `kept`'s id in the store (a request that used it succeeded)."""
        if self.durable is not None:
            self.durable.name(kept.public_id, kept.handle.id, kept.tenant, list(kept.key))

    def release(self, handles: Iterable[Handle], *, ok: bool) -> None:
        """A request that claimed `handles` ended (`ok`: it succeeded). A message nobody
        claims any more and no request succeeded with is freed."""
        for h in handles:
            kept = self._owned.get(h.id)
            if kept is None:
                continue
            kept.claims -= 1
            if ok and not kept.committed:
                kept.committed = True
                self._name(kept)
            if kept.claims <= 0 and not kept.committed:
                self._drop(self._owned.pop(h.id))
        self._evict()

    def _evict(self) -> None:
        over = len(self._owned) - self.size
        tokens = self._tokens - (self.budget if self.budget is not None else self._tokens)
        if over <= 0 and tokens <= 0:
            return
        victims = []
        for mid, kept in self._owned.items():  # least recently used first; claimed ones stay
            if over <= 0 and tokens <= 0:
                break
            if kept.claims <= 0:
                victims.append(mid)
                over, tokens = over - 1, tokens - kept.handle.length
        for mid in victims:
            self._drop(self._owned.pop(mid))

    def _drop(self, kept: Kept) -> None:
        self._tokens -= kept.handle.length
        if self._by_key.get(kept.key) is kept:
            del self._by_key[kept.key]
        self._by_public.pop(kept.public_id, None)
        if self.durable is not None:
            self.durable.unname(kept.public_id)
        if not kept.handle.freed:
            self.engine.free(kept.handle)

    def __len__(self) -> int:
        return len(self._owned)

    def tokens(self) -> int:
        """Tokens of the live messages it owns (the store slots it holds)."""
        return sum(k.handle.length for k in self._owned.values() if not k.handle.freed)

    def clear(self) -> None:
        """Free every message it owns."""
        while self._owned:
            self._drop(self._owned.popitem()[1])

    def close(self) -> None:
        """The server stops: free every message it owns, or with a store keep them
        (and their ids) for the next server on it; requests that never succeeded
        with a message free it either way."""
        if self.durable is None:
            return self.clear()
        for mid in [m for m, k in self._owned.items() if not k.committed]:
            self._drop(self._owned.pop(mid))
        self._owned.clear()
        self._by_key.clear()
        self._by_public.clear()
