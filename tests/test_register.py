"""engine/exec/register.py: a finished call's message, and what its encoding attended to."""

from __future__ import annotations

from corps.cache.messages import Message, MessageTable
from corps.engine.exec.call import Call, CallPlan
from corps.engine.exec.register import own_tokens, register
from corps.engine.request.sampling_params import SamplingParams


def _call(parents: tuple[int, ...], generated: list[int] | None = None) -> Call:
    plan = CallPlan(
        kind="decode" if generated is not None else "prefill",
        role="user",
        offset=3,
        parents=parents,
        parent_offsets=tuple(range(len(parents))),
        owner="alice",
        visibility=None,
        own=2,
        prefix=[1, 2, 7, 8],
        sampling=SamplingParams() if generated is not None else None,
    )
    return Call(plan, [], [], [7, 8, 9], 0, text="hi", generated=list(generated or []))


def test_sources_are_transitive_only_when_encodings_were_reused():
    table = MessageTable()
    root = table.next_id()
    table.add(Message(root, [1], "", "user", "prefill", [], 0, (), ()))
    mid = table.next_id()
    table.add(
        Message(mid, [2], "", "user", "prefill", [], 1, (root,), (0,), sources=frozenset({root}))
    )
    chor = register(table, _call((mid,)), [7], [5], reused_encodings=True)
    base = register(table, _call((mid,)), [7], [], reused_encodings=False)
    assert chor.sources == {chor.parents[0], *chor.parents[0].sources}
    assert {h.id for h in chor.sources} == {mid, root}
    assert {h.id for h in base.sources} == {mid}


def test_a_decode_records_where_its_sampled_tokens_are():
    table = MessageTable()
    c = _call((), generated=[40, 41])
    assert own_tokens(c) == [7, 8]
    h = register(table, c, own_tokens(c) + c.generated + [2], [], reused_encodings=True)
    assert h.generated == [40, 41] and h.tokens == [7, 8, 40, 41, 2]
    assert c.slots == []  # the message owns them now
