"""Which engine worker runs a workflow next: least loaded, or the one that shares its prefix.

A cluster (`corps.patterns.cluster.runner`) asks the `Router` for a worker each time a
workflow can start. Load is counted in tokens in flight (an estimate per
workflow: its input's prompt plus its decode budget), not in workflows, so a
long input weighs what it costs. Inputs whose text shares a long prefix with
one a worker ran recently go to that worker while it has a free slot (Parrot's
co-location): its radix cache then holds the shared prefix's encoding and only
the rest is encoded. While those workers are busy such an input may wait a
little (the cluster lets others pass it, a bounded number of times). Pure
bookkeeping; no Ray, no engine.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class _Worker:
    slots: int  # workflows it may run at once
    running: int = 0
    tokens: int = 0  # estimated tokens of the workflows it runs
    recent: deque[str] = field(default_factory=lambda: deque(maxlen=64))


class Router:
    """`choose(key)` a worker, `start` and `finish` what runs on it.

    `co_locate`: characters of common prefix that make two inputs "share a long
    prompt prefix" (0 turns co-location off).
    """

    def __init__(self, co_locate: int = 256) -> None:
        self.co_locate = co_locate
        self._workers: dict[str, _Worker] = {}

    def add(self, worker: str, slots: int) -> None:
        if slots < 1:
            raise ValueError("a worker needs at least one slot")
        self._workers[worker] = _Worker(slots)

    def remove(self, worker: str) -> None:
        self._workers.pop(worker, None)

    @property
    def workers(self) -> list[str]:
        return list(self._workers)

    def load(self, worker: str) -> int:
        """Estimated tokens in flight on `worker`."""
        return self._workers[worker].tokens

    def running(self, worker: str) -> int:
        return self._workers[worker].running

    def free(self) -> list[str]:
        """Workers with a free slot."""
        return [name for name, w in self._workers.items() if w.running < w.slots]

    def choose(self, key: str, *, wait: bool = False) -> str | None:
        """The worker to run an input whose prompt text is `key` on; None when every
        worker is busy (or there is none). Workers that ran an input sharing a long
        prefix with `key` come first; when all of them are busy, `wait=True` returns
        None (the input waits for one of them) rather than the least loaded."""
        free = self.free()
        if not free:
            return None
        if self.co_locate:
            holders = [n for n in self._workers if self._shared(n, key) >= self.co_locate]
            if holders:
                ready = [n for n in holders if n in free]
                if ready:
                    return min(ready, key=self._weight)
                if wait:
                    return None
        return min(free, key=self._weight)

    def _weight(self, worker: str) -> tuple[int, int]:
        w = self._workers[worker]
        return (w.tokens, w.running)

    def _shared(self, worker: str, key: str) -> int:
        return max((_common(key, k) for k in self._workers[worker].recent), default=0)

    def start(self, worker: str, key: str, cost: int) -> None:
        w = self._workers[worker]
        w.running += 1
        w.tokens += cost
        w.recent.append(key)

    def finish(self, worker: str, cost: int) -> None:
        w = self._workers.get(worker)
        if w is not None:  # a worker removed meanwhile has nothing left to count
            w.running -= 1
            w.tokens -= cost


def _common(a: str, b: str) -> int:
    """Length of the common prefix of two texts."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def estimate_tokens(key: str, decode_budget: int) -> int:
    """A workflow's weight: its input's prompt (about 4 characters a token) plus what it
    may decode."""
    return len(key) // 4 + 1 + decode_budget


def prompt_key(params: dict) -> str:
    """The text an input puts in front of the model: its texts (in lists too), in order."""
    return "\n".join(_texts(list(params.values())))


def _texts(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _texts(v)]
    if isinstance(value, dict):
        return _texts(list(value.values()))
    return []
