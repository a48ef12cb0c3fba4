"""Registering a finished call's message in the table: the one place messages are made."""

from __future__ import annotations

from corps.cache.handle import Handle
from corps.cache.messages import Message, MessageTable
from corps.engine.exec.call import Call


def own_tokens(c: Call) -> list[int]:
    """The call's own tokens of its prompt (framing included): the new message's start."""
    return c.plan.prefix[len(c.plan.prefix) - c.plan.own :]


def register(
    table: MessageTable, c: Call, tokens: list[int], slots: list[int], *, reused_encodings: bool
) -> Handle:
    """Add c's message (its `tokens`, K/V in `slots`, none if text only) and return
    its handle. `reused_encodings`: the call attended to its parents' encodings
    (choreography), so it also attended to everything those attended to."""
    mid = table.next_id()
    complete = c.matcher is None or c.matcher.is_accepting()
    constraint = c.plan.sampling.constraint if c.plan.is_decode else None
    table.add(
        Message(
            mid,
            list(tokens),
            c.text,
            c.plan.role,
            c.plan.kind,
            list(slots),
            c.plan.offset,
            c.plan.parents,
            c.plan.parent_offsets,
            c.plan.owner,
            c.plan.visibility,
            sources=_sources(table, c.plan.parents, reused_encodings),
            generated_from=c.plan.own if c.plan.is_decode else 0,
            generated=len(c.generated),
            finish_reason=c.finish_reason,
            logprobs=tuple(c.logprobs),
            greedy=tuple(c.greedy),
            top_logprobs=tuple(c.top),
            complete=complete,
            spans=tuple(c.spans),
            repair=str(c.repair.policy) if c.repair is not None else "",
            value=constraint.parse(c.text) if constraint is not None and complete else None,
        )
    )
    c.slots = []  # the message owns them now; an abort must not release them
    return Handle(mid, table)


def _sources(table: MessageTable, parents: tuple[int, ...], transitive: bool) -> frozenset[int]:
    """What a new encoding attends to: its parents and (choreographed) their sources.
    A call that re-encodes its parents from their text attends to those alone."""
    out: set[int] = set(parents)
    if transitive:
        for p in parents:
            out |= table.get(p).sources
    return frozenset(out)
