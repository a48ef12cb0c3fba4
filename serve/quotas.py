"""Who may hold how much of `corps serve`: the server's places and each key's quota.

`Gate` admits a request or answers 429 with `Retry-After`:

- the server holds at most `size` requests (`--max-queue`), whoever sent them;
- a key holds at most its `max_requests` (key file); a key without one, on a
  server of two or more tenants, at most `size - size // 4` (at least one place
  fewer than all): one key cannot fill the server for everyone;
- a key that has spent its `tokens_per_minute` (prompt and completion tokens of
  its requests that ended in the last minute) is refused until enough of them are
  a minute old (`Retry-After`: until the oldest leaves the window).

A refusal changes nothing: the request is refused before it is read further.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from corps.serve.errors import ServeError
from corps.serve.principals import Principal

WINDOW_S = 60.0  # the tokens_per_minute window


@dataclass
class Held:
    """One key's requests inside, and its spent tokens in the window (time, tokens)."""

    inside: int = 0
    spent: deque = field(default_factory=deque)
    total: int = 0  # sum of `spent`'s tokens


class Gate:
    """At most `size` requests inside the server and each key within its quota;
    `take(principal)` or 429, `leave(principal, tokens)` when its request ends."""

    def __init__(
        self, size: int, tenants: int = 1, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.size, self.inside, self.clock = size, 0, clock
        # a key without its own max_requests, beside other tenants: leave a quarter free
        self.per_key = size - max(1, size // 4) if tenants > 1 and size > 1 else size
        self.held: dict[Principal, Held] = {}

    def take(self, principal: Principal) -> None:
        """Enter as `principal` (ServeError 429 when the server or the key is full)."""
        if self.inside >= self.size:
            raise _busy(f"the server holds {self.size} requests already; retry shortly", 1)
        held = self.held.setdefault(principal, Held())
        cap = principal.quota.max_requests or self.per_key
        if held.inside >= cap:
            raise _busy(f"this API key holds {cap} requests already (its limit); retry when "
                        f"one ends", 1)  # fmt: skip
        limit = principal.quota.tokens_per_minute
        if limit is not None:
            self._forget(held)
            if held.total >= limit:
                wait = WINDOW_S - (self.clock() - held.spent[0][0])
                raise _busy(f"this API key spent its {limit} tokens a minute; retry after "
                            f"the time given", max(1, math.ceil(wait)))  # fmt: skip
        held.inside += 1
        self.inside += 1

    def leave(self, principal: Principal, tokens: int = 0) -> None:
        """The request of `principal` ended, having spent `tokens` (prompt + completion)."""
        self.inside -= 1
        held = self.held[principal]
        held.inside -= 1
        if tokens > 0 and principal.quota.tokens_per_minute is not None:
            held.spent.append((self.clock(), tokens))
            held.total += tokens
        if not held.inside and not held.spent:
            del self.held[principal]  # keys come and go: keep none that holds nothing

    def inside_by_tenant(self) -> dict[str, int]:
        """Requests inside now, per tenant."""
        out: dict[str, int] = {}
        for p, held in self.held.items():
            out[p.tenant] = out.get(p.tenant, 0) + held.inside
        return out

    def _forget(self, held: Held) -> None:
        old = self.clock() - WINDOW_S
        while held.spent and held.spent[0][0] <= old:
            held.total -= held.spent.popleft()[1]


def _busy(message: str, retry_after: int) -> ServeError:
    return ServeError(429, message, "rate_limit_error", headers={"Retry-After": str(retry_after)})
