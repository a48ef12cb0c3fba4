"""Whether choreography changes what a call reads: a *rewired* context.

A call reads its parents' encodings as they were made. When the parents form a
chain (the first encoded right after the attention sink with no parents, each
next one encoded on exactly the ones before it, at the positions it is read at,
with no gap, and the call's own tokens right after the last), what the call reads
is what encoding the whole conversation afresh would give: the baseline's
context, token for token. Anything else is rewired: parents encoded apart that
never saw each other (blockage), a parent encoded over context the call does not
read (leakage), or a parent moved to other positions.

An adapter trained with `scope="rewired"` (`corps distill --scope rewired`) is
applied only to calls whose context is rewired, so a chain call runs the base
model exactly; the engine (serving) and the differentiable recompute (training)
decide it with this one function. Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol


class Placed(Protocol):
    """What the criterion reads of a message (a `Message` or a graph `Node`)."""

    @property
    def tokens(self) -> Sequence[int]: ...
    @property
    def offset(self) -> int: ...
    @property
    def parents(self) -> Sequence[int]: ...
    @property
    def parent_offsets(self) -> Sequence[int]: ...


def rewired(
    offset: int,
    parents: Sequence[int],
    parent_offsets: Sequence[int],
    lookup: Callable[[int], Placed],
    start: int,
) -> bool:
    """True unless a call at `offset` reading `parents` at `parent_offsets` reads a
    chain (see the module) starting at position `start` (the sink's length)."""
    first = first_rewired(parents, parent_offsets, lookup, start)
    if first < len(parents):
        return True
    return offset != start + sum(len(lookup(p).tokens) for p in parents)


def first_rewired(
    parents: Sequence[int],
    parent_offsets: Sequence[int],
    lookup: Callable[[int], Placed],
    start: int,
) -> int:
    """The index of the first parent not read as a chain continues (see the module),
    or len(parents) when they all are: that parent and every one after it read
    encodings made in another context than the call's (a repair recomputes among
    their tokens, `corps.engine.request.repair`)."""
    at = start
    for i, (pid, placed) in enumerate(zip(parents, parent_offsets, strict=True)):
        p = lookup(pid)
        chained = (
            placed == at == p.offset
            and tuple(p.parents) == tuple(parents[:i])
            and tuple(p.parent_offsets) == tuple(parent_offsets[:i])
        )
        if not chained:
            return i
        at += len(p.tokens)
    return len(parents)
