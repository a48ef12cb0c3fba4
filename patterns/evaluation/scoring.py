"""Task scores of a pattern's result against an input line's reference.

An input line holds the pattern's parameters plus, for scoring, a reference the
pattern does not take (`REFERENCE_KEYS`): `answer` for the math patterns. Each
scorer returns a bool (correct or not: compared with McNemar's test) or a float
(a share: compared with a paired bootstrap), `corps.patterns.evaluation.significance`.

- multi-QA: both (all) questions answered: each reference answer appears in the reply;
- tree of thoughts, debate, parallel debate: the final answer equals the reference
  (numbers compared as numbers, else normalised text);
- branch-solve-merge: the share of concepts present in the final story;
- prisoner's dilemma: the share of players who cooperate (`cooperation_alice`,
  `cooperation_bob` in the details give each).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from corps.cache.errors import InvalidRequest
from corps.patterns.parsing import normalize
from corps.patterns.result import PatternResult

Score = bool | float
#: Keys of an input line that are references for scoring, not pattern parameters.
REFERENCE_KEYS = ("answer", "id")


def without_references(line: Mapping[str, Any], takes: Iterable[str] = ()) -> dict[str, Any]:
    """An input line without its scoring references, but those named in `takes` (the
    parameters of the pattern it is for)."""
    keep = set(takes)
    return {k: v for k, v in line.items() if k not in REFERENCE_KEYS or k in keep}


def split_line(line: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pattern parameters, references) of an input line."""
    params = {k: v for k, v in line.items() if k not in REFERENCE_KEYS}
    refs = {k: v for k, v in line.items() if k in REFERENCE_KEYS}
    return params, refs


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def same_answer(got: str | None, reference: str) -> bool:
    """Equal as numbers when both are, else as normalised text."""
    a, b = normalize(got), normalize(str(reference))
    if a is None or b is None:
        return False
    x, y = _number(a), _number(b)
    return abs(x - y) < 1e-9 if x is not None and y is not None else a == b


def multi_qa(result: PatternResult, line: Mapping[str, Any]) -> bool:
    answered = result.details.get("answered")
    if answered is None:
        raise InvalidRequest("multi_qa is scored on `answers`: give one per question in each line")
    return all(answered)


def math(result: PatternResult, line: Mapping[str, Any]) -> bool:
    if "answer" not in line:
        raise InvalidRequest('math patterns are scored on "answer": add it to each input line')
    return same_answer(result.answer, line["answer"])


def concepts(result: PatternResult, line: Mapping[str, Any]) -> float:
    """The pattern's own coverage: the share of its concepts the final story uses."""
    return float(result.details["coverage"])


def cooperation(result: PatternResult, line: Mapping[str, Any]) -> float:
    choices = result.details.get("decisions") or {}
    if not choices:
        raise InvalidRequest("prisoners_dilemma result has no decisions to score")
    # an unparsed decision counts as cooperation, as the pattern plays it
    return sum((v or "COOPERATE") == "COOPERATE" for v in choices.values()) / len(choices)


SCORERS: dict[str, Callable[[PatternResult, Mapping[str, Any]], Score]] = {
    "multi_qa": multi_qa,
    "tree_of_thoughts": math,
    "debate": math,
    "parallel_debate": math,
    "branch_solve_merge": concepts,
    "prisoners_dilemma": cooperation,
}


def scorer(pattern: str) -> Callable[[PatternResult, Mapping[str, Any]], Score]:
    if pattern not in SCORERS:
        raise InvalidRequest(f"no task score for {pattern}; scored patterns: {', '.join(SCORERS)}")
    return SCORERS[pattern]
