"""Input sets with exact answers, for `corps fidelity`, `eval` and `distill`.

- `question_pairs`: multi-QA lines, two short questions with exact answers each
  (arithmetic, comparisons, counting letters, unit conversions: what the default
  135M model answers sometimes), generated from a seed: no data is vendored.
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

WORDS = (
    "apple", "river", "garden", "pencil", "window", "planet", "orange", "music",
    "bridge", "candle", "forest", "kitten", "yellow", "doctor", "basket", "winter",
)  # fmt: skip
UNITS = (  # (bigger unit, smaller unit, how many)
    ("hours", "minutes", 60),
    ("minutes", "seconds", 60),
    ("weeks", "days", 7),
    ("meters", "centimeters", 100),
    ("kilograms", "grams", 1000),
    ("dozens", "eggs", 12),
)


def _arithmetic(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(2, 20), rng.randint(2, 20)
    op = rng.choice(("plus", "minus", "times"))
    if op == "minus" and b > a:
        a, b = b, a
    value = {"plus": a + b, "minus": a - b, "times": a * b}[op]
    return f"What is {a} {op} {b}?", str(value)


def _comparison(rng: random.Random) -> tuple[str, str]:
    a, b = rng.sample(range(2, 100), 2)
    which = rng.choice(("larger", "smaller"))
    return f"Which number is {which}, {a} or {b}?", str(
        max(a, b) if which == "larger" else min(a, b)
    )


def _counting(rng: random.Random) -> tuple[str, str]:
    word = rng.choice(WORDS)
    return f'How many letters are in the word "{word}"?', str(len(word))


def _conversion(rng: random.Random) -> tuple[str, str]:
    big, small, k = rng.choice(UNITS)
    n = rng.randint(2, 9)
    return f"How many {small} are in {n} {big}?", str(n * k)


KINDS: tuple[Callable[[random.Random], tuple[str, str]], ...] = (
    _arithmetic,
    _comparison,
    _counting,
    _conversion,
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
        raise InvalidRequest("the math inputs come from CHAMP: pip install champ-dataset") from None
    problems = champ_dataset.load("v0").problems
    numeric = [
        dict(id=pid, question=p.text, answer=p.answer.strip())
        for pid, p in sorted(problems.items())
        if re.fullmatch(r"-?\d+(\.\d+)?", p.answer.strip())
    ]
    return numeric[skip : None if n is None else skip + n]
