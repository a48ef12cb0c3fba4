"""Input sets with exact answers (corps.patterns.evaluation.inputs)."""

from __future__ import annotations

import re

import pytest

from corps.cache.errors import InvalidRequest
from corps.patterns.evaluation.inputs import CAPITALS, champ_problems, question_pairs


def test_question_pairs_are_seeded_exact_and_distinguishable():
    pairs = question_pairs(300, seed=3)
    assert pairs == question_pairs(300, seed=3) and pairs != question_pairs(300, seed=4)
    assert len({p["id"] for p in pairs}) == 300
    for p in pairs:
        a1, a2 = p["answers"]
        assert len(p["questions"]) == 2 and a1 not in a2 and a2 not in a1
    for p in pairs:  # the answers are right
        for q, a in zip(p["questions"], p["answers"], strict=True):
            if m := re.fullmatch(r"What is (\d+) plus (\d+)\?", q):
                assert int(a) == int(m[1]) + int(m[2])
            elif m := re.fullmatch(r"What is the capital of (\w+)\?", q):
                assert (m[1], a) in CAPITALS
    kinds = {q.split()[2] for p in pairs for q in p["questions"]}
    assert len(kinds) >= 5  # every kind shows up
    with pytest.raises(InvalidRequest):
        question_pairs(0)


def test_champ_problems_with_numeric_answers_split_by_position():
    first, rest = champ_problems(10), champ_problems(10, skip=10)
    assert len(first) == len(rest) == 10
    assert not {p["id"] for p in first} & {p["id"] for p in rest}
    assert all(re.fullmatch(r"-?\d+(\.\d+)?", p["answer"]) for p in first + rest)
    assert set(first[0]) == {"id", "question", "answer"}
