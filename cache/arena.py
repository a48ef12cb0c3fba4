"""One buffer that every in-flight call's view is carved from.

Views of calls live side by side in one (L, Hkv, A, D) tensor, so a decode step
over many calls can append all their new keys with one `index_copy_` and read
all their contexts with one `index_select` per layer, instead of a dozen small
ops per call. Ranges are handed out first-fit; a call whose view does not fit
waits (`ViewsFull`) until running calls give theirs back: the arena is part of
the engine's memory budget, and views never spill outside it.
"""

from __future__ import annotations

import bisect
import itertools

import torch

from corps.cache.errors import require


class ViewArena:
    def __init__(
        self,
        *,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> None:
        # one token more than the capacity, never handed out: `scratch`. Zeros, not
        # empty: FlexAttention reads a window of the arena and masks what a row may not
        # see, but a masked key's weight 0 times a never-written value that happens to
        # be NaN or inf is NaN, and its row with it (tokens 0 in CI, now and then)
        shape = (num_layers, num_kv_heads, capacity + 1, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # (L, Hkv, A, D), rotated keys
        self.v = torch.zeros(shape, dtype=dtype, device=device)  # (L, Hkv, A, D)
        self.k_layers = self.k.unbind(0)
        self.v_layers = self.v.unbind(0)
        self.capacity = capacity
        # the token padding rows of a static decode step append to and read (a view
        # of one key; `corps.engine.model.static_decode`): no view ever holds it
        self.scratch = capacity
        self._free: list[tuple[int, int]] = [(0, capacity)]  # sorted (start, length)

    def drop(self) -> None:
        """Give the tensors' memory back (the engine is closing); bookkeeping stays."""
        self.k = self.k[:, :, :0].clone()  # (L, Hkv, 0, D)
        self.v = self.v[:, :, :0].clone()
        self.k_layers = self.v_layers = ()

    @property
    def free_tokens(self) -> int:
        return sum(n for _, n in self._free)

    def alloc(self, n: int) -> int | None:
        """Start of a free range of n tokens, or None if no range is long enough."""
        for i, (start, length) in enumerate(self._free):
            if length >= n:
                if length == n:
                    del self._free[i]
                else:
                    self._free[i] = (start + n, length - n)
                return start
        return None

    def check_idle(self) -> None:
        """BrokenInvariant unless every range is back, merged, in order."""
        ranges = self._free
        require(ranges == sorted(ranges), "view arena free ranges out of order")
        for (a, n), (b, _) in itertools.pairwise(ranges):
            require(a + n < b, "view arena ranges overlap or were not merged")
        require(self.free_tokens == self.capacity, "a view arena range was never released")

    def release(self, start: int, n: int) -> None:
        i = bisect.bisect(self._free, (start, n))
        self._free.insert(i, (start, n))
        if i + 1 < len(self._free) and start + n == self._free[i + 1][0]:  # merge right
            self._free[i] = (start, n + self._free.pop(i + 1)[1])
        if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == start:  # merge left
            prev = self._free.pop(i - 1)
            self._free[i - 1] = (prev[0], prev[1] + self._free[i - 1][1])
