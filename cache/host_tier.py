"""A host-memory tier under a GPU's KV store: evicted encodings kept in (pinned) host
memory and copied back by one host-to-device copy, instead of recomputed.

`Memory.evict` hands each encoding it drops to its tier (`put`); a call that reads
an evicted message first asks the tier for it (`take`). This tier keeps encodings
in host memory up to `budget` bytes, least recently put leaving first, each moving
down to the tier below it when there is one (the store directory's files,
`corps.cache.durable`) or dropped (recomputed when read) when there is none. A
freed message's copy goes at once (`discard`). On a CPU the KV store is host
memory already, so the engine puts this tier only under a GPU's store (`pin`:
page-locked, so the copy back runs at the bus's speed).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Protocol

import torch
from torch import Tensor

from corps.cache.messages import Message


class Below(Protocol):
    """The tier under this one (`corps.engine.exec.memory.Tier`)."""

    def put(self, m: Message, k: Tensor, v: Tensor) -> None: ...
    def take(self, m: Message) -> tuple[Tensor, Tensor] | None: ...
    def discard(self, m: Message) -> None: ...


class HostTier:
    """Evicted encodings in host memory, at most `budget` bytes, above `below`."""

    def __init__(self, budget: int, below: Below | None = None, *, pin: bool = False) -> None:
        if budget < 0:
            raise ValueError(f"a host tier's budget is bytes >= 0, got {budget}")
        self.budget, self.below, self.pin = budget, below, pin
        self._kept: OrderedDict[int, tuple[Message, Tensor, Tensor]] = OrderedDict()
        self.nbytes = 0
        self.tokens = 0  # tokens whose encodings it holds now
        self.moved_down = 0  # encodings it passed to the tier below (or dropped) for room
        # the torch thread puts and takes; a `free` on the event loop discards
        self._lock = threading.Lock()

    def _host(self, t: Tensor) -> Tensor:
        out = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=self.pin)
        return out.copy_(t)

    def put(self, m: Message, k: Tensor, v: Tensor) -> None:
        """Keep m's evicted encoding (K unrotated and V: (L, n, Hkv, D) each); what no
        longer fits goes down, least recently put first. One larger than the whole
        budget goes straight down."""
        size = k.numel() * k.element_size() + v.numel() * v.element_size()
        if size > self.budget:
            self._down(m, k, v)
            return
        host = (m, self._host(k), self._host(v))
        with self._lock:
            again = self._kept.pop(m.id, None)  # evicted again since: the newer copy wins
            if again is not None:
                self._forget(*again)
            out = []
            while self._kept and self.nbytes + size > self.budget:
                _, old = self._kept.popitem(last=False)
                self._forget(*old)
                out.append(old)
            self._kept[m.id] = host
            self.nbytes += size
            self.tokens += k.shape[1]
        for old in out:
            self._down(*old)

    def take(self, m: Message) -> tuple[Tensor, Tensor] | None:
        """m's encoding, from here (and no longer kept here) or from the tier below;
        None if neither has it."""
        with self._lock:
            got = self._kept.pop(m.id, None)
            if got is not None:
                self._forget(*got)
        if got is not None:
            return got[1], got[2]
        return None if self.below is None else self.below.take(m)

    def discard(self, m: Message) -> None:
        """m was freed: its copy here goes (the tier below keeps its own rules)."""
        with self._lock:
            got = self._kept.pop(m.id, None)
            if got is not None:
                self._forget(*got)
        if self.below is not None:
            self.below.discard(m)

    def _forget(self, m: Message, k: Tensor, v: Tensor) -> None:
        self.nbytes -= k.numel() * k.element_size() + v.numel() * v.element_size()
        self.tokens -= k.shape[1]

    def _down(self, m: Message, k: Tensor, v: Tensor) -> None:
        self.moved_down += 1
        if self.below is not None:
            self.below.put(m, k, v)

    def ids(self) -> list[int]:
        """The messages whose encodings it holds, least recently put first."""
        with self._lock:
            return list(self._kept)
