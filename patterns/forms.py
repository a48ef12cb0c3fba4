"""The fixed forms of patterns' outputs, as constraints (`corps.engine.request.constraint`).

Where a pattern parses what an agent says (a vote, a verdict, two groups, a
decision, numbered answers, a boxed answer), the decode is constrained to that
form, so the parse cannot fail. Each form comes with the `max_tokens` it needs
at one character per token (at least the run's), so a constrained turn always
completes; free text stays free. Patterns take `constrained=False` to decode as before (what
`corps bench constrained` compares against).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

#: Free text in a form gets as many characters as this many per token of the run's
#: max_tokens would write (what the model writes on average, roughly); the turn's
#: max_tokens then covers the worst case of one character per token.
CHARS_PER_TOKEN = 3
#: What a boxed answer may hold: a number, a fraction, a short expression.
ANSWER_CHARS = r"[0-9A-Za-z.,/ +\-]"
ANSWER_LEN = 12
#: Plain printable text in a JSON string: one character each, nothing escaped.
PLAIN = "^[ !#-\\[\\]-~]*$"

#: The debate moderator's verdict, in the order its prompt names the fields.
VERDICT_SCHEMA = {
    "type": "object",
    "properties": {
        "Reasoning": {"type": "string", "maxLength": 160, "pattern": PLAIN},
        "Preference": {"enum": ["yes", "no"]},
        "Answer": {"type": "string", "maxLength": 40, "pattern": PLAIN},
    },
    "required": ["Reasoning", "Preference", "Answer"],
    "additionalProperties": False,
}

#: A prisoner's-dilemma player's final decision, as its prompt asks for it.
DECISION_SCHEMA = {
    "type": "object",
    "properties": {"decision": {"enum": ["COOPERATE", "DEFECT"]}},
    "required": ["decision"],
    "additionalProperties": False,
}


def literal(text: str) -> str:
    """`text` as a regex that matches exactly it."""
    return "".join("\\" + ch if ch in r"\.^$|?*+()[]{}-" else ch for ch in text)


def boxed(max_tokens: int) -> dict[str, Any]:
    r"""Free reasoning (no backslash), then the answer in \boxed{...}."""
    cost = len("\\boxed{}") + ANSWER_LEN
    free = CHARS_PER_TOKEN * max(0, max_tokens - cost)  # as much reasoning as free text
    regex = rf"[^\\]{{0,{free}}}\\boxed\{{{ANSWER_CHARS}{{1,{ANSWER_LEN}}}\}}"
    return dict(regex=regex, max_tokens=free + cost)


def verdict(max_tokens: int) -> dict[str, Any]:
    """The moderator's JSON verdict (VERDICT_SCHEMA)."""
    longest = {"Reasoning": "x" * 160, "Preference": "yes", "Answer": "y" * 40}
    return dict(json_schema=VERDICT_SCHEMA, max_tokens=max(max_tokens, len(json.dumps(longest))))


def decision(max_tokens: int) -> dict[str, Any]:
    """A player's JSON decision (DECISION_SCHEMA)."""
    longest = json.dumps({"decision": "COOPERATE"})
    return dict(json_schema=DECISION_SCHEMA, max_tokens=max(max_tokens, len(longest)))


def numbered(n: int, max_tokens: int) -> dict[str, Any]:
    """After a "1." header: n numbered one-line answers (" a\\n2. b\\n3. c")."""
    per = max(16, CHARS_PER_TOKEN * (max_tokens - 4 * n) // n)  # a line's characters
    line = rf" [^\n]{{1,{per}}}"
    regex = line + "".join(rf"\n{i}\.{line}" for i in range(2, n + 1))
    return dict(regex=regex, max_tokens=max(max_tokens, n * (per + 4)))


def groups(concepts: Sequence[str]) -> dict[str, Any]:
    """After a "Group 1:" header: the first group, 1 to n - 1 of the given concepts,
    comma-separated; the second group is the rest (`rest_of`), so both are never
    empty, whatever the model repeats."""
    one = "(" + "|".join(literal(c) for c in concepts) + ")"
    longest = max(len(c) for c in concepts) + 2  # ", " before each
    return dict(
        regex=rf" {one}(, {one}){{0,{max(0, len(concepts) - 2)}}}",
        max_tokens=(len(concepts) - 1) * longest + 1,
    )


def rest_of(text: str, concepts: Sequence[str]) -> tuple[list[str], list[str]]:
    """The two groups of a `groups` reply: the concepts it names, and the others."""
    named = {part.strip() for part in text.split(",")}
    first = [c for c in concepts if c in named]
    return first, [c for c in concepts if c not in named]


def options(n: int) -> dict[str, Any]:
    """One of the candidate numbers 1..n (a vote)."""
    return dict(choices=tuple(str(i + 1) for i in range(n)))


def only(constrained: bool, form: dict[str, Any]) -> dict[str, Any]:
    """A turn's form (its constraint and the tokens it needs) if `constrained`, else none."""
    return form if constrained else {}
