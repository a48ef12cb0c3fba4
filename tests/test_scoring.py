"""Task scorers (corps.patterns.evaluation.scoring) against hand-built results."""

from __future__ import annotations

import pytest

from corps.cache.errors import InvalidRequest
from corps.patterns.evaluation.scoring import same_answer, scorer, split_line
from corps.patterns.parsing import answered
from corps.patterns.result import PatternResult


def _result(pattern: str, answer: str | None, **details) -> PatternResult:
    return PatternResult(
        pattern=pattern, mode="choreographed", answer=answer, details=details, messages=[],
        parse_errors=[], tokens_encoded=0, tokens_reused=0, wall_s=0.0, mean_ttft_s=None,
        leaks=0,
    )  # fmt: skip


def test_multi_qa_needs_every_answer_as_a_word():
    assert answered("1. It is 10.\n2. Six letters", ["10", "six"]) == [True, True]
    assert answered("1. 110\n2. 6", ["10", "6"]) == [False, True]  # not inside a number
    assert answered("1. 6\n2. 10", ["10", "6"]) == [True, True]  # in any order
    assert answered("Parisian food", ["Paris"]) == [False]
    assert answered("1. 1.5", ["1"]) == [False]
    assert answered("1. yes\n2) no", ["1", "2"]) == [False, False]  # list markers
    assert answered("1. 2\n2. 1", ["1", "2"]) == [True, True]
    score = scorer("multi_qa")
    assert score(_result("multi_qa", "x", answered=[True, True]), {}) is True
    assert score(_result("multi_qa", "x", answered=[True, False]), {}) is False
    with pytest.raises(InvalidRequest, match="answers"):
        score(_result("multi_qa", "x"), {})


@pytest.mark.parametrize(
    "got, ref, same",
    [("42", "42", True), ("42.0", "42", True), ("$1,000", "1000", True), ("41", "42", False),
     ("\\frac{1}{2}", "\\frac{1}{2}", True), (None, "3", False), ("No", "no", True)],
)  # fmt: skip
def test_math_answers_compare_as_numbers_or_normalised_text(got, ref, same):
    assert same_answer(got, ref) is same
    for pattern in ("tree_of_thoughts", "debate", "parallel_debate"):
        assert scorer(pattern)(_result(pattern, got), {"answer": ref}) is same


def test_math_needs_a_reference():
    with pytest.raises(InvalidRequest, match='"answer"'):
        scorer("debate")(_result("debate", "3"), {})


def test_story_coverage_and_cooperation():
    assert (
        scorer("branch_solve_merge")(_result("branch_solve_merge", "s", coverage=0.75), {}) == 0.75
    )
    pd = scorer("prisoners_dilemma")
    assert (
        pd(_result("prisoners_dilemma", "", decisions={"Alice": "DEFECT", "Bob": "COOPERATE"}), {})
        == 0.5
    )
    assert (
        pd(_result("prisoners_dilemma", "", decisions={"Alice": None, "Bob": "COOPERATE"}), {})
        == 1.0
    )


def test_unscored_patterns_and_references_split_off():
    with pytest.raises(InvalidRequest, match="no task score for map_reduce"):
        scorer("map_reduce")
    assert split_line({"question": "q", "answer": "1", "id": "x"}) == (
        {"question": "q"}, {"answer": "1", "id": "x"},
    )  # fmt: skip
