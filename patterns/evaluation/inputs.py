"""Input sets with exact answers, for `corps fidelity`, `eval` and `distill`.

- `question_pairs`: multi-QA lines, two short questions with one-word answers
  each (small sums, capitals, colours, animals' legs, opposites: what the default
  135M model answers sometimes; multi-digit arithmetic, comparisons, counting
  letters and unit conversions it almost never did, 0 of 200 pairs both right
  even in the baseline), generated from a seed: no data is vendored.
- `champ_problems`: the CHAMP competition math problems (`pip install
  champ-dataset`, MIT) whose answer is a plain number (exactly scorable), for the
  math patterns, as `{"question": ..., "answer": ...}` lines; the order is fixed
  (by problem id), so `--skip` / `--n` give disjoint splits.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

from corps.cache.errors import InvalidRequest

CAPITALS = (
    ("France", "Paris"), ("Japan", "Tokyo"), ("Italy", "Rome"), ("Germany", "Berlin"),
    ("Spain", "Madrid"), ("England", "London"), ("Russia", "Moscow"), ("China", "Beijing"),
    ("Egypt", "Cairo"), ("Greece", "Athens"),
)  # fmt: skip
COLOURS = (
    ("grass", "green"), ("the sky on a clear day", "blue"), ("snow", "white"),
    ("a ripe banana", "yellow"), ("coal", "black"), ("a ripe tomato", "red"),
)  # fmt: skip
LEGS = (("a dog", "4"), ("a spider", "8"), ("a bird", "2"), ("an ant", "6"), ("a cow", "4"))
OPPOSITES = (
    ("hot", "cold"), ("up", "down"), ("big", "small"), ("day", "night"), ("fast", "slow"),
    ("happy", "sad"), ("open", "closed"), ("left", "right"),
)  # fmt: skip


def _addition(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(1, 5), rng.randint(1, 4)
    return f"What is {a} plus {b}?", str(a + b)


def _looked_up(question: str, table: tuple[tuple[str, str], ...]):
    """A kind of question whose answer a table gives: `question` formats the key."""

    def kind(rng: random.Random) -> tuple[str, str]:
        key, answer = rng.choice(table)
        return question.format(key), answer

    return kind


_capital = _looked_up("What is the capital of {}?", CAPITALS)
_colour = _looked_up("What colour is {}?", COLOURS)
_legs = _looked_up("How many legs does {} have?", LEGS)
_opposite = _looked_up('What is the opposite of "{}"?', OPPOSITES)


KINDS: tuple[Callable[[random.Random], tuple[str, str]], ...] = (
    _addition,
    _capital,
    _colour,
    _legs,
    _opposite,
)


def question_pairs(n: int, seed: int = 0) -> list[dict]:
    """n multi-QA lines {"id", "questions", "answers"}: two questions of different
    kinds whose answers differ and neither contains the other."""
    if n < 1:
        raise InvalidRequest(f"need at least one pair, got n={n}")
    rng, out = random.Random(seed), []
    while len(out) < n:
        k1, k2 = rng.sample(KINDS, 2)
        (q1, a1), (q2, a2) = k1(rng), k2(rng)
        if a1 in a2 or a2 in a1:
            continue
        out.append(dict(id=f"pair-{seed}-{len(out)}", questions=[q1, q2], answers=[a1, a2]))
    return out


def champ_problems(n: int | None = None, skip: int = 0) -> list[dict]:
    """CHAMP problems with a plain numeric answer, by id: lines {"id", "question",
    "answer"} from `skip`, at most `n`. Needs `pip install champ-dataset`."""
    try:
        import champ_dataset
    except ImportError:
        raise InvalidRequest(
            "the math inputs come from CHAMP: pip install 'corps[math]' (champ-dataset)"
        ) from None
    problems = champ_dataset.load("v0").problems
    numeric = [
        dict(id=pid, question=p.text, answer=p.answer.strip())
        for pid, p in sorted(problems.items())
        if re.fullmatch(r"-?\d+(\.\d+)?", p.answer.strip())
    ]
    return numeric[skip : None if n is None else skip + n]
