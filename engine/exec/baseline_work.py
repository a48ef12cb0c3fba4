"""`BaselineWork`: what the baseline would encode for each call of a choreographed
engine, and so how much a repair may recompute.

Choreography's promise is less work than the baseline for the same workflow. A
repair (`corps.engine.repair`) spends some of what choreography saved: it
recomputes rewired context the baseline would have encoded anyway. It must not
spend more than was saved, so every repair is capped here (`Repair.cap`).

The baseline renders a decode's parents as one causal prompt (the sink, each
parent's framed tokens, the new message's header) behind a prefix cache that
holds every earlier decode's prompt and reply; a baseline prefill stores text. A
shadow of that cache (a radix tree of token ids without encodings,
`corps.cache.radix`, as large as the store) sees each choreographed decode's
prompt at admission and its reply when it ends. A decode's *miss* is its
context past the longest prefix the shadow holds: what the baseline encodes of
it. Part of the miss both modes pay once: the tokens of a prefilled message no
earlier decode read, which choreography encoded at its prefill and the baseline
encodes now. The rest the baseline encodes again where choreography reads it as
it is: the decode's *saving*, which its repair may spend, less a margin:

    bound = floor((1 - MARGIN) * (miss - first read))

A decode's saving can be negative: choreography encodes a decode's header, its
last sampled token and its footer, where the baseline may find the header
cached and encodes the rest only where a later prompt reads it. Savings and
such deficits are banked (`credit`); a decode spends at most its own saving and
what the bank holds with it, a prefill's repair (the baseline encodes nothing at
a prefill) only what the bank holds, and at most its own context's miss. So no
call recomputes more than the baseline would encode of its context, and repairs
spend only savings already made: choreography's total (prefills, decodes,
repairs) exceeds the baseline's by at most the prefilled tokens the baseline
never encodes (messages no decode reads, text its cache held already) and the
deficits of calls after the last repair, which choreography pays with no repair
at all (tests/test_baseline_work.py checks both against a brute-force baseline).
Such a deficit is the baseline's prefix cache at its best: calls that repeat one
context and header, which it encodes once and choreography's headers each time.

Calls that keep their logits (an audit's shadow, which reads as the baseline
does to measure it, within the audit budget) are not capped. Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from corps.cache.messages import MessageTable
from corps.cache.radix import RadixCache

#: The share of a decode's saving its repair leaves unspent: choreography stays
#: cheaper than the baseline even on the calls it repairs.
MARGIN = 0.1


class BaselineWork:
    """A shadow of the baseline's prefix cache, and the repair bounds it gives."""

    def __init__(self, table: MessageTable, sink: Sequence[int], capacity: int) -> None:
        self.table, self.sink = table, list(sink)
        self.capacity = capacity  # tokens the shadow keeps (the store's, as the baseline's)
        self.shadow = RadixCache()
        self.seen: set[int] = set()  # prefilled messages some decode read
        self.credit = 0  # savings not yet spent (negative: overheads not yet paid back)

    def reset(self) -> None:
        """Forget what the baseline would have cached and the savings so far, as at
        the engine's opening (`Engine.reset_prefix_cache`)."""
        self.shadow = RadixCache()
        self.seen.clear()
        self.credit = 0

    def bound(self, call: Work) -> int:
        """At most how many context tokens `call` may recompute."""
        if not call.decode:
            miss, _, _ = self._miss(self._context(call.parents), call.parents, (), call.salt)
            return _spendable(min(miss, self.credit))
        saving = self.saving(call)
        return _spendable(min(saving, self.credit + saving))

    def admitted(self, call: Work, repaired: int) -> None:
        """`call` was admitted and recomputes `repaired` tokens; a decode's prompt enters
        the shadow, as the baseline's cache holds it while the decode runs."""
        self.credit -= repaired
        if not call.decode:
            return
        ctx = self._context(call.parents)  # built once for the saving and the insert
        self.credit += self._saving(ctx, call)
        self._insert(ctx + list(call.header), call.salt)
        self.seen.update(p for p in call.parents if self.table.get(p).kind == "prefill")
        if len(self.seen) > 2 * self.table.records + 64:  # forget forgotten messages
            self.seen = {i for i in self.seen if self.table.find(i) is not None}

    def saving(self, call: Work) -> int:
        """What the baseline encodes for a decode beyond what choreography encodes for it
        (negative: choreography encodes more): its context's miss, less the prefilled
        tokens read here first, the header tokens the baseline finds cached, and what
        choreography encodes that the baseline encodes only where it is read again
        (the last sampled token and the closing footer, `extra`)."""
        return self._saving(self._context(call.parents), call)

    def _saving(self, ctx: list[int], call: Work) -> int:
        miss, first, header_hit = self._miss(ctx, call.parents, call.header, call.salt)
        return miss - first - header_hit - call.extra

    def read(self, parents: Sequence[int], tail: Sequence[int], salt: str | None) -> None:
        """The baseline's cache holds `parents` then `tail` (a decode's prompt and reply)."""
        self._insert(self._context(parents) + list(tail), salt)

    def _insert(self, tokens: list[int], salt: str | None) -> None:
        self.shadow.insert(tokens, [-1] * len(tokens), salt=salt)
        over = self.shadow.size - self.capacity
        if over > 0:  # least recently used first, as the baseline's cache gives room
            self.shadow.evict(over)

    def _context(self, parents: Sequence[int]) -> list[int]:
        return self.sink + [t for p in parents for t in self.table.get(p).tokens]

    def _miss(
        self, ctx: list[int], parents: Sequence[int], header: Sequence[int], salt: str | None
    ) -> tuple[int, int, int]:
        """Of a prompt (`ctx`, the context of `parents`, then `header`) against the
        shadow's longest prefix: the context tokens past it; of them, the tokens of
        prefilled messages no decode read yet; and the header tokens within it."""
        hit = self.shadow.peek(ctx + list(header), salt)
        at, first = len(self.sink), 0
        for pid in parents:
            m = self.table.get(pid)
            end = at + len(m.tokens)
            if m.kind == "prefill" and pid not in self.seen:
                first += max(0, end - max(at, hit))
            at = end
        return max(0, len(ctx) - hit), first, max(0, hit - len(ctx))


@dataclass(frozen=True)
class Work:
    """What the bound reads of a call: its parents, a decode's header tokens, its cache
    salt, and the tokens choreography encodes for a decode beyond its header and
    sampled ones (the last sampled token's row and the closing footer)."""

    parents: tuple[int, ...]
    header: tuple[int, ...] = ()
    salt: str | None = None
    decode: bool = True
    extra: int = 0


def _spendable(tokens: int) -> int:
    return math.floor((1.0 - MARGIN) * max(0, tokens))
