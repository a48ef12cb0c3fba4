"""What `corps bench gpu`'s sections share: their names, the workflows it measures, a
measured line (`Figure`), the run's settings, and timing with the device synchronised."""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import torch

#: the sections, in the order they run
SECTIONS = (
    "prefill", "decode", "streams", "profile", "graphs", "patterns", "memory", "workflows",
    "account",
)  # fmt: skip

#: workflows and their settings: the paper's three, and tree of thoughts 8x8
WORKFLOWS: dict[str, tuple[str, dict]] = {
    "debate": ("debate", dict(rounds=3)),
    "tree_of_thoughts": ("tree_of_thoughts", dict(branches=8, voters=4)),
    "parallel_debate": ("parallel_debate", dict(agents=3, rounds=3)),
    "tree_of_thoughts_8x8": ("tree_of_thoughts", dict(branches=8, voters=8)),
}


@dataclass
class Figure:
    """One measured line: corps' figure, the reference's, and corps / reference."""

    section: str
    name: str
    corps: float
    reference: float
    unit: str
    note: str = ""
    error: str = ""  # a figure that could not be measured says why (its section failed)
    ratio: float = field(init=False)

    def __post_init__(self) -> None:
        self.ratio = self.corps / self.reference if self.reference else math.nan


@dataclass(frozen=True)
class Settings:
    model: str
    dtype: str
    device: str
    weights: str = "auto"  # EngineConfig.weights of every engine (transformers: dense)
    prompt_tokens: int = 2048
    spans: int = 16
    span_tokens: int = 128
    context_tokens: int = 1024
    decode_tokens: int = 128
    streams: tuple[int, ...] = (16, 64)
    stream_tokens: int = 64
    workflows: tuple[str, ...] = tuple(WORKFLOWS)
    workflow_tokens: int = 64
    runs: int = 2
    repeats: int = 3
    graphs: str = "auto"  # EngineConfig.graphs of the measured engine
    sections: tuple[str, ...] = SECTIONS
    memory_budget: int | None = None  # of every engine but the memory section's
    engines: int = 4  # the memory section's engines, opened and closed in sequence
    patterns: tuple[str, ...] = ()  # the account section's patterns (empty: all built in)
    account_count: str = "kernels"  # the account's counted run (corps.bench.account.COUNTS)

    def budget_kw(self) -> dict[str, Any]:
        """The measured engines' `memory_budget`, when set."""
        return {"memory_budget": self.memory_budget} if self.memory_budget else {}

    def engine_kw(self) -> dict[str, Any]:
        """`Engine.open` settings shared by the measured engines."""
        return dict(dtype=self.dtype, device=self.device, weights=self.weights, **self.budget_kw())


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


async def timed(device: str, fn: Callable[[], Awaitable[Any]], repeats: int) -> float:
    """Best seconds of `repeats` awaits of fn(), the device synchronised around each."""
    best = math.inf
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        await fn()
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def release(device: str) -> None:
    """Give cached device memory back before the next engine sizes its store."""
    import gc

    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
