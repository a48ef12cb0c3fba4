"""What every pattern returns: a `PatternResult`."""

from __future__ import annotations

import json
import math
from typing import Any

from pydantic import BaseModel, ConfigDict, field_serializer

from corps.cache.handle import Handle


class PatternResult(BaseModel):
    """The outcome of one workflow run.

    `messages` holds the handles of every message the run made, in order (its
    instruction prefills included); as JSON each becomes its id, role, owner,
    parents and text. Token counts are summed over those messages: what their
    calls ran through the model, and what they reused from the cache.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    pattern: str
    mode: str
    answer: str | None
    details: dict[str, Any]
    messages: list[Handle]
    parse_errors: list[str]
    tokens_encoded: int
    tokens_reused: int
    wall_s: float
    mean_ttft_s: float | None
    leaks: int

    @field_serializer("messages")
    def _messages(self, messages: list[Handle]) -> list[dict[str, Any]]:
        return [
            dict(
                id=h.id,
                role=h.role,
                owner=h.owner,
                parents=[p.id for p in h.parents],
                offset=h.offset,
                text=h.text,
            )
            for h in messages
        ]

    @field_serializer("mean_ttft_s")
    def _ttft(self, value: float | None) -> float | None:
        return None if value is None or math.isnan(value) else value

    @property
    def calls(self) -> int:
        return len(self.messages)


def to_json(result: Any) -> Any:
    """A workflow's result as plain JSON values (a PatternResult's messages as text)."""
    if isinstance(result, PatternResult):
        return json.loads(result.model_dump_json())
    return json.loads(json.dumps(result, default=repr))
