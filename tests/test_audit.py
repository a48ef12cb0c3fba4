"""engine/audit.py: audit rates are checked, and the book sums audits per key."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corps.engine.audit import MAX_AUDIT, Audit, AuditBook, AuditKey, check_audit
from corps.engine.errors import InvalidRequest


@pytest.mark.parametrize("good", [None, 0, 1, 7, MAX_AUDIT])
def test_rates_from_none_to_the_maximum(good):
    assert check_audit(good) == good


@pytest.mark.parametrize("bad", [-1, MAX_AUDIT + 1, "3", True, 2.0, [1]])
def test_other_rates_are_refused_saying_what_they_take(bad):
    with pytest.raises(InvalidRequest, match="1 in N"):
        check_audit(bad)


def test_an_empty_book_has_no_figures():
    book = AuditBook()
    assert book.rows() == [] and book.total().calls == 0 and math.isnan(book.total().gap)


audits = st.lists(
    st.tuples(
        st.sampled_from(["a", "b"]),
        st.integers(1, 8),
        st.floats(0.0, 5.0),
        st.floats(0.0, 1.0),
        st.integers(0, 100),
    ),
    min_size=1,
    max_size=30,
)


@given(audits)
def test_the_book_weighs_each_audit_by_its_positions(items):
    book = AuditBook()
    for i, (agent, n, gap, agree, tokens) in enumerate(items):
        book.add(Audit(i, AuditKey("w", agent, "none"), n, gap, agree, tokens))
    for row in book.rows():  # the oracle: the sums by hand
        mine = [x for x in items if x[0] == row.key.agent]
        n = sum(x[1] for x in mine)
        assert row.calls == len(mine) and row.positions == n
        assert row.gap == pytest.approx(sum(x[1] * x[2] for x in mine) / n)
        assert row.agreement == pytest.approx(sum(x[1] * x[3] for x in mine) / n)
        assert row.tokens == sum(x[4] for x in mine)
    total = book.total()
    assert total.calls == len(items) and total.positions == sum(x[1] for x in items)
