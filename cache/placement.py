"""Where a call puts its parents and its new message (offsets), and the mask that follows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from corps.cache.errors import ContextOverflow, PositionError


@dataclass(frozen=True)
class Placement:
    starts: tuple[int, ...]  # logical start of each parent
    new_offset: int  # logical start of the new message


def place(
    lengths: Sequence[int],
    offsets: Sequence[int | None] | None,
    new_offset: int | None,
    *,
    sink: int,
) -> Placement:
    """Resolve offsets: an omitted one starts right after the previous parent (or the sink)."""
    if offsets is None:
        offsets = [None] * len(lengths)
    offsets = list(offsets)
    if len(offsets) != len(lengths):
        raise PositionError(
            f"offsets has {len(offsets)} entries for {len(lengths)} parents; give one per "
            f"parent (None for the default)"
        )
    cursor, starts = sink, []
    for length, off in zip(lengths, offsets, strict=True):
        start = cursor if off is None else _checked(off, "offset")
        starts.append(start)
        cursor = start + length
    new = cursor if new_offset is None else _checked(new_offset, "new_offset")
    return Placement(tuple(starts), new)


def _checked(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PositionError(f"{name} must be an int, got {value!r}")
    if value < 0:
        raise PositionError(f"{name} must be >= 0, got {value}")
    return value


def check_limit(last_position: int, max_positions: int, what: str) -> None:
    if last_position >= max_positions:
        raise ContextOverflow(
            f"{what} reaches logical position {last_position}, past the model's context length "
            f"{max_positions}; use smaller offsets, fewer parents or fewer max_tokens"
        )
