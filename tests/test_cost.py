"""engine/sched/cost.py: the online fit of a step's seconds on its calls and rows,
against the exact linear model it must recover and a brute-force least squares."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corps.engine.exec.step_plan import decode_keys
from corps.engine.sched.cost import StepCost, _nonnegative_fit


def test_nothing_is_predicted_before_steps_of_two_sizes():
    cost = StepCost()
    assert cost.predict(1, 1) is None
    for _ in range(5):
        cost.observe(1, 1, 0.02)
    assert not cost.ready and cost.coefficients() is None
    cost.observe(4, 4, 0.03)
    assert cost.ready and cost.predict(1, 1) == pytest.approx(0.02, rel=1e-3)


def test_steps_that_ran_nothing_are_ignored():
    cost = StepCost()
    for calls, rows, s in [(0, 0, 0.01), (1, 0, 0.01), (2, 2, 0.0), (2, 2, float("nan"))]:
        cost.observe(calls, rows, s)
    cost.observe(2, 9, 0.01, chunks=3)  # more chunks than calls
    assert not cost.ready


def test_an_exact_linear_cost_is_recovered():
    cost = StepCost()
    steps = [(1, 1, 0), (2, 2, 0), (4, 68, 1), (8, 8, 0), (3, 200, 2), (16, 16, 0), (1, 64, 1)]
    for calls, rows, chunks in steps:
        cost.observe(calls, rows, 0.017 + 0.001 * calls + 0.0005 * rows + 0.004 * chunks, chunks)
    assert cost.coefficients() == pytest.approx((0.017, 0.001, 0.0005, 0.004, 0), abs=1e-6)


def test_the_keys_decodes_read_are_recovered_and_predicted():
    """A step costs 20 ms + 1 ms a call + 5 ms per 1000 keys: the fit gives that back,
    and four calls over long views are predicted slower than over short ones."""
    cost = StepCost()
    steps = [(1, 100), (1, 1500), (4, 100), (4, 800), (8, 400), (2, 3000), (16, 50)]
    for i, (calls, longest) in enumerate(steps):
        keys = decode_keys([longest] * calls)
        seconds = 0.020 + 0.001 * calls + 0.005 * keys / 1000
        cost.observe(calls, calls + 3 * i, seconds, keys=keys)  # rows cost nothing
    assert cost.coefficients() == pytest.approx((0.020, 0.001, 0, 0, 0.005), abs=1e-7)
    assert cost.predict(4, 4, keys=6000) == pytest.approx(0.054)
    assert cost.predict(4, 4, keys=400) == pytest.approx(0.026)
    assert cost.max_rows(4, 0, 0.030, 512, keys=6000) == 0  # the keys alone overrun it
    cost.observe(2, 2, 0.01, keys=-1)  # nonsense is ignored
    assert cost.predict(4, 4, keys=400) == pytest.approx(0.026)


def test_a_cost_falling_with_calls_is_fit_with_no_negative_coefficient():
    cost = StepCost()
    for calls in (1, 2, 3, 4):
        cost.observe(calls, calls, 0.05 - 0.01 * calls)
    assert all(x >= 0 for x in cost.coefficients())


def test_older_steps_weigh_less():
    cost = StepCost(decay=0.9)
    for _ in range(200):  # the machine was slow
        cost.observe(1, 1, 0.1)
        cost.observe(2, 2, 0.2)
    for _ in range(200):  # it is fast now
        cost.observe(1, 1, 0.01)
        cost.observe(2, 2, 0.02)
    assert cost.predict(1, 1) == pytest.approx(0.01, rel=1e-3)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 32), st.integers(0, 512), st.floats(1e-3, 1.0)),
        min_size=3,
        max_size=30,
    )
)
def test_the_fit_is_the_best_nonnegative_least_squares(steps):
    """Brute force: no nonnegative (a, b, c) on a grid around it fits better."""
    x = np.array([[1.0, c, c + r, min(c, r)] for c, r, _ in steps])  # rows >= calls
    y = np.array([s for _, _, s in steps])
    xx, xy = (x.T @ x).tolist(), (x.T @ y).tolist()
    theta = np.array(_nonnegative_fit(xx, xy))
    assert (theta >= 0).all()
    loss = float(np.sum((x @ theta - y) ** 2))
    for a in np.linspace(0, 1, 11):
        for b in np.linspace(0, 0.1, 11):
            for c in np.linspace(0, 0.01, 6):
                for d in np.linspace(0, 0.05, 6):
                    other = float(np.sum((x @ np.array([a, b, c, d]) - y) ** 2))
                    assert loss <= other * (1 + 1e-6) + 1e-7 * float(y @ y)  # ridge


def test_a_measure_of_rows_replaces_the_rows_and_bounds_them():
    """Products that jump from one row to two (a gemv, then a gemm) are learnt exactly
    when the fit is given their measured seconds, which a line in rows cannot do."""
    table = {1: 0.010, 2: 0.015, 3: 0.0155, 4: 0.016, 8: 0.018}
    measured = StepCost(products=lambda r: table.get(r, 0.018 + 0.001 * (r - 8)))
    linear = StepCost()
    for calls, rows in [(1, 1), (2, 2), (4, 4), (3, 8), (2, 30), (1, 1)]:
        s = 0.002 + 0.001 * calls + measured.products(rows)
        measured.observe(calls, rows, s)
        linear.observe(calls, rows, s)
    assert measured.predict(1, 1) == pytest.approx(0.013, rel=1e-3)
    assert measured.predict(2, 2) == pytest.approx(0.019, rel=1e-3)
    assert abs(linear.predict(1, 1) - 0.013) > 0.0005  # the line misses the lone row
    # rows a step of 2 calls may hold within 22 ms: P(rows) <= 0.018, i.e. 8
    assert measured.max_rows(2, 0, 0.022, 512) == 8
    assert measured.max_rows(2, 0, 0.001, 512) == 0
    assert StepCost().max_rows(1, 0, 1.0, 8) is None
