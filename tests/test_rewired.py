"""Whether a call's context is rewired (corps.cache.rewired), on hand-built messages."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from corps.cache.rewired import first_rewired, rewired


@dataclass
class M:
    tokens: tuple[int, ...]
    offset: int
    parents: tuple[int, ...] = ()
    parent_offsets: tuple[int, ...] = ()


# a system prompt (3 tokens at 2, after a 2-token sink), a question on it, an answer on
# both, and a second question encoded apart on the system prompt only
TABLE = {
    1: M((0,) * 3, 2),
    2: M((0,) * 4, 5, (1,), (2,)),
    3: M((0,) * 5, 9, (1, 2), (2, 5)),
    4: M((0,) * 4, 5, (1,), (2,)),
}


def is_rewired(offset, parents, offsets, start=2):
    return rewired(offset, parents, offsets, TABLE.__getitem__, start)


@pytest.mark.parametrize(
    "offset, parents, offsets",
    [
        (2, (), ()),  # nothing but the sink
        (5, (1,), (2,)),
        (9, (1, 2), (2, 5)),
        (14, (1, 2, 3), (2, 5, 9)),
        (9, (1, 4), (2, 5)),  # 4 was encoded on 1 at 5 too: a chain as well
    ],
)
def test_a_chain_read_where_it_was_encoded_is_not_rewired(offset, parents, offsets):
    assert not is_rewired(offset, parents, offsets)


@pytest.mark.parametrize(
    "offset, parents, offsets, why",
    [
        (13, (1, 2, 4), (2, 5, 9), "4 never saw 2 (blockage)"),
        (11, (1, 2), (2, 5), "a gap before the call"),
        (12, (1, 2), (2, 8), "2 moved"),
        (7, (2,), (2,), "2 was encoded over 1, which the call does not read (leakage)"),
        (14, (1, 3), (2, 5), "3 read without 2"),
        (3, (), (), "the call's own tokens moved"),
        (6, (1,), (3,), "1 moved"),
    ],
)
def test_anything_else_is_rewired(offset, parents, offsets, why):
    assert is_rewired(offset, parents, offsets), why


def test_the_sink_length_sets_where_a_chain_starts():
    assert not is_rewired(5, (1,), (2,), start=2)
    assert is_rewired(5, (1,), (2,), start=0)


@pytest.mark.parametrize(
    "parents, offsets, first",
    [
        ((1, 2, 3), (2, 5, 9), 3),  # a chain: nothing rewired
        ((1, 2, 4), (2, 5, 9), 2),  # 4 never saw 2
        ((1, 4, 2), (2, 5, 9), 2),  # 4 reads as a chain continues, 2 does not
        ((2,), (2,), 0),  # 2 was encoded over 1
        ((1, 2), (2, 8), 1),  # 2 moved
    ],
)
def test_the_first_rewired_parent_is_where_the_chain_breaks(parents, offsets, first):
    assert first_rewired(parents, offsets, TABLE.__getitem__, 2) == first
