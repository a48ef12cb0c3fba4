"""cache/store_rows.py: a message's record round-trips through JSON (hypothesis); a
visibility a store cannot hold is a typed error."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corps.cache.errors import StoreError
from corps.cache.messages import CallFigures, Message
from corps.cache.store_rows import decode, encode
from corps.cache.visibility import Private, Public, Shared

ints = st.lists(st.integers(0, 50_000), max_size=8)

visibilities = st.sampled_from([None, Public(), Private(), Shared({"a", "b"})])


@st.composite
def messages(draw) -> Message:
    tokens = draw(st.lists(st.integers(0, 50_000), min_size=1, max_size=12))
    parents = tuple(draw(st.lists(st.integers(0, 99), max_size=4)))
    msg = Message(
        draw(st.integers(1, 10**9)), tokens, draw(st.text(max_size=40)),
        draw(st.sampled_from(["user", "assistant", "system"])),
        draw(st.sampled_from(["prefill", "decode"])), [], draw(st.integers(0, 4096)),
        parents, tuple(draw(st.integers(0, 4096)) for _ in parents),
        draw(st.none() | st.text(max_size=8)), draw(visibilities),
        sources=frozenset(parents), freed=draw(st.booleans()),
        generated=draw(st.integers(0, 9)), finish_reason=draw(st.none() | st.just("max_tokens")),
        logprobs=tuple(draw(st.lists(st.floats(-50, 0), max_size=3))),
        top_logprobs=((( 3, -0.5), (4, -1.0)),), figures=CallFigures(tokens_encoded=7, ttft_s=0.1),
        spans=tuple(draw(ints)), repair=draw(st.sampled_from(["", "query:0.3"])),
    )  # fmt: skip
    msg.evicted = draw(st.booleans())
    return msg


@settings(max_examples=60, deadline=None)
@given(messages())
def test_a_record_round_trips_through_json(msg):
    """Every field kept comes back as it was (slots never: it comes back evicted
    if it was encoded, and is encoded again or copied in when read)."""
    back = decode(encode(msg))
    for f in ("id", "tokens", "text", "role", "kind", "offset", "parents", "parent_offsets",
              "owner", "visibility", "sources", "freed", "generated", "finish_reason",
              "logprobs", "top_logprobs", "figures", "spans", "repair"):  # fmt: skip
        assert getattr(back, f) == getattr(msg, f), f
    assert back.slots == [] and back.evicted == msg.evicted


def test_a_visibility_no_store_can_hold_is_refused_typed():
    class Odd:
        pass

    msg = Message(1, [5], "x", "user", "prefill", [], 0, (), (), None, Odd())
    with pytest.raises(StoreError, match="cannot be stored"):
        encode(msg)
