"""Engine statistics: a frozen snapshot."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineStats:
    mode: str
    capacity: int  # token slots in the store
    tokens_used: int
    tokens_free: int
    messages: int  # live messages (the attention sink not counted)
    tokens_encoded: int  # tokens run through the model
    tokens_reused: int  # cached tokens attended to without being re-encoded
    prefix_hit_tokens: int  # baseline: prompt tokens found in the radix cache
    prefix_query_tokens: int  # baseline: prompt tokens looked up

    @property
    def prefix_hit_rate(self) -> float:
        return (
            self.prefix_hit_tokens / self.prefix_query_tokens if self.prefix_query_tokens else 0.0
        )
