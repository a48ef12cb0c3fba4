"""Parsing model outputs (corps.patterns.parsing): never raises, range-checks, falls back."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from corps.patterns.parsing import (
    majority,
    normalize,
    parse_answer,
    parse_boxed,
    parse_choice,
    parse_decision,
    parse_fields,
    parse_groups,
    parse_json_object,
)


def test_choices_are_range_checked():
    assert parse_choice("BEST CHOICE: 3", 4) == 3
    assert parse_choice("best choice: #2 because", 4) == 2
    assert parse_choice("BEST CHOICE: 0", 4) is None  # the reference silently took the last
    assert parse_choice("BEST CHOICE: 9", 4) is None
    assert parse_choice("I like the second one", 4) is None
    assert parse_choice("Solution 4 is right", 4) == 4


def test_a_number_that_is_not_the_replys_answer_is_not_a_vote():
    """Malformed votes count as parse errors instead of votes for whatever number
    the reply mentions later."""
    assert parse_choice("BEST CHOICE: \n Step 2: add the boxes", 4) is None
    assert parse_choice("BEST CHOICE: Step 2 is best", 4) is None
    assert parse_choice("BEST CHOICE:\n2", 4) is None  # the format puts it on the line
    assert parse_choice("BEST CHOICE: 2.5", 4) is None  # not a candidate number
    assert parse_choice("BEST CHOICE: \nBEST CHOICE:", 4) is None
    assert parse_choice("BEST CHOICE: 3, since 2 adds wrong", 4) == 3
    assert parse_choice("BEST CHOICE:\t#1.", 4) == 1
    assert parse_choice("BEST CHOICE: BEST CHOICE: 1.\nThis is the 1st option.", 4) == 1


def test_answers():
    assert parse_boxed(r"so \boxed{\frac{1}{2}} done") == r"\frac{1}{2}"
    assert parse_boxed(r"\boxed{1} then \boxed{2}") == "2"
    assert parse_boxed(r"\boxed{unclosed") is None
    assert parse_answer("The answer is 18.") == "18"
    assert parse_answer("we get 3 then 18") == "18"
    assert parse_answer("no numbers here") is None
    assert normalize(" $1,800. ") == "1800"


def test_json_decisions_and_groups():
    assert parse_json_object('noise {"Preference": "yes", "Answer": "18"} tail') == {
        "preference": "yes",
        "answer": "18",
    }
    assert parse_json_object('{"broken": ') is None
    near = '{"Reasoning": "ok", "Preference": "yes" or "no", "Answer": "18"}'
    assert parse_fields(near, ("Preference", "Answer")) == {"preference": "yes", "answer": "18"}
    assert parse_fields("nothing", ("Preference",)) is None
    assert parse_decision('{"decision": "defect"}') == "DEFECT"
    assert parse_decision("I will COOPERATE") == "COOPERATE"
    assert parse_decision("undecided") is None
    concepts = ["dog", "park", "rain", "kite"]
    assert parse_groups("Group 1: dog, rain\nGroup 2: park", concepts) == (
        ["dog", "rain", "kite"],
        ["park"],
    ) or parse_groups("Group 1: dog, rain\nGroup 2: park", concepts) == (
        ["dog", "rain"],
        ["park", "kite"],
    )
    assert parse_groups("dog and park", concepts) is None


def test_majority_ties_go_to_the_first_seen():
    assert majority([2, 3, 3, 2]) == (2, {2: 2, 3: 2})
    assert majority([]) == (None, {})


@given(st.text(), st.integers(1, 20))
def test_parsers_never_raise(text, n):
    choice = parse_choice(text, n)
    assert choice is None or 1 <= choice <= n
    parse_answer(text), parse_json_object(text), parse_decision(text)
    parse_groups(text, ["a", "b"])
