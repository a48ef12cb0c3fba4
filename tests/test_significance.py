"""Paired significance (corps.patterns.evaluation.significance) against hand-computed cases."""

from __future__ import annotations

import pytest

from corps.patterns.evaluation.significance import compare, mcnemar, paired_bootstrap


def test_mcnemar_is_the_exact_binomial_test_on_discordant_pairs():
    # b = 1 (only A right), c = 6 (only B right): p = 2 * P[X <= 1], X ~ Bin(7, 1/2)
    a = [True] * 5 + [True] + [False] * 6 + [False] * 3
    b = [True] * 5 + [False] + [True] * 6 + [False] * 3
    c = mcnemar(a, b)
    assert c.detail == dict(only_a=1, only_b=6)
    assert c.p == pytest.approx(2 * (1 + 7) / 128)
    assert c.a == pytest.approx(6 / 15) and c.b == pytest.approx(11 / 15)
    assert not c.significant  # 0.125


def test_mcnemar_edge_cases():
    assert mcnemar([True, False], [True, False]).p == 1.0  # no discordant pair
    c = mcnemar([False] * 10, [True] * 10)
    assert c.p == pytest.approx(2 / 1024) and c.significant
    assert mcnemar([True, False, True], [False, True, True]).p == 1.0  # capped at 1


def test_the_paired_bootstrap_brackets_the_mean_difference():
    a = [0.5, 0.6, 0.4, 0.5, 0.7, 0.3]
    same = paired_bootstrap(a, a)
    assert same.detail["mean_diff"] == 0 and same.p == 1.0
    up = paired_bootstrap(a, [x + 0.2 for x in a])
    assert up.detail["mean_diff"] == pytest.approx(0.2)
    assert up.detail["low"] == pytest.approx(0.2) and up.p == 0.0
    noisy = paired_bootstrap(a, [0.6, 0.5, 0.5, 0.4, 0.8, 0.3])
    assert noisy.detail["low"] < noisy.detail["mean_diff"] < noisy.detail["high"]
    assert 0.05 < noisy.p <= 1.0


def test_compare_picks_the_test_and_refuses_unpaired_scores():
    assert compare([True, False], [True, True]).test == "mcnemar"
    assert compare([0.5, 1.0], [1.0, 1.0]).test == "bootstrap"
    with pytest.raises(ValueError, match="same inputs"):
        compare([True], [True, False])
    with pytest.raises(ValueError, match="same inputs"):
        compare([], [])
