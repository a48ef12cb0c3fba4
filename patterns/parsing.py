"""Robust parsing of model outputs: every parser returns None on malformed text.

Patterns record a None as a parse error and fall back (first candidate, keep
debating, ...); nothing here raises on what a model writes.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Hashable, Sequence

_INT = re.compile(r"-?\d+")


def parse_choice(text: str, n: int) -> int | None:
    """A 1-based candidate index in 1..n. With "BEST CHOICE:" in the text, the vote is
    the number right after its last occurrence, on the same line (`BEST CHOICE: 3`, `#3`); anything
    else there is no vote, even if a number follows later (`BEST CHOICE: \n Step 2`
    names a step, not a candidate). Without the marker, the first integer. None if
    there is none or it is out of range: a malformed vote, counted as a parse error."""
    markers = list(re.finditer(r"BEST CHOICE:", text, flags=re.IGNORECASE))
    if markers:  # the last one: a reply may repeat the header it was given
        m = re.match(r"[ \t]*#?[ \t]*(\d+)(?![\d.]\d)", text[markers[-1].end() :])
        found = m.group(1) if m else None
    else:
        found = _INT.search(text).group(0) if _INT.search(text) else None
    if found is None:
        return None
    k = int(found)
    return k if 1 <= k <= n else None


def parse_boxed(text: str) -> str | None:
    r"""The content of the last \boxed{...} (nested braces allowed), stripped."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j].strip() or None
    return None


def parse_answer(text: str) -> str | None:
    r"""A final answer: \boxed{...}, else what follows "answer:", else the last number."""
    boxed = parse_boxed(text)
    if boxed is not None:
        return boxed
    m = re.search(r"answer\s*(?:is)?\s*[:=]?\s*([^\n.]+)", text, flags=re.IGNORECASE)
    if m and m.group(1).strip():
        return m.group(1).strip()
    numbers = _INT.findall(text)
    return numbers[-1] if numbers else None


def parse_json_object(text: str) -> dict | None:
    """The first {...} in the text that parses as a JSON object, keys lower-cased."""
    for m in re.finditer(r"\{", text):
        depth = 0
        for j in range(m.start(), len(text)):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            if depth == 0:
                try:
                    obj = json.loads(text[m.start() : j + 1])
                except ValueError:
                    break
                if isinstance(obj, dict):
                    return {str(k).lower(): v for k, v in obj.items()}
                break
    return None


def parse_fields(text: str, names: Sequence[str]) -> dict | None:
    """JSON-ish fields: a JSON object if one parses, else each `"name": "value"` found
    (small models often write near-JSON). Keys lower-cased; None if none is found."""
    obj = parse_json_object(text)
    if obj is not None:
        return obj
    out = {}
    for name in names:
        m = re.search(rf'"{name}"\s*:\s*"([^"]*)"', text, flags=re.IGNORECASE)
        if m:
            out[name.lower()] = m.group(1)
    return out or None


def parse_decision(text: str) -> str | None:
    """COOPERATE or DEFECT: from a JSON "decision" field, else the last one mentioned."""
    obj = parse_json_object(text)
    if obj and str(obj.get("decision", "")).upper() in ("COOPERATE", "DEFECT"):
        return str(obj["decision"]).upper()
    found = re.findall(r"\b(COOPERATE|DEFECT)\b", text.upper())
    return found[-1] if found else None


def parse_groups(text: str, concepts: Sequence[str]) -> tuple[list[str], list[str]] | None:
    """Two groups of concepts from "Group 1: a, b ... Group 2: c, d".

    Only known concepts count; each goes to the first group naming it; every
    concept not named goes to the smaller group. None unless both groups are named.
    """
    m = re.search(r"group\s*1\s*:(.*?)group\s*2\s*:(.*)", text, flags=re.IGNORECASE | re.DOTALL)
    if not m:
        return None
    groups: list[list[str]] = [[], []]
    for c in concepts:
        for g, part in enumerate(m.groups()):
            if re.search(rf"\b{re.escape(c)}\b", part, flags=re.IGNORECASE):
                groups[g].append(c)
                break
        else:
            groups[0 if len(groups[0]) <= len(groups[1]) else 1].append(c)
    if not groups[0] or not groups[1]:
        return None
    return groups[0], groups[1]


def majority(values: Sequence[Hashable]) -> tuple[Hashable | None, dict]:
    """The most common value; ties go to the one seen first. (None, {}) if empty."""
    counts = Counter(values)
    if not counts:
        return None, {}
    best = max(counts.values())
    winner = next(v for v in values if counts[v] == best)
    return winner, dict(counts)


def normalize(answer: str | None) -> str | None:
    """An answer in a comparable form: no spaces, $, trailing dot or thousands commas."""
    if answer is None:
        return None
    out = re.sub(r"[\s$]", "", answer).rstrip(".").replace(",", "")
    return out.lower() or None


def answered(text: str, answers: Sequence[str]) -> list[bool]:
    """Whether a reply gives each answer: as a whole word, case-insensitive, anywhere
    in it ("5" is not found in "15", nor "Paris" in "Parisian"). Anywhere, not in
    item k of a numbered list: small models answer the questions in any order."""
    text = re.sub(r"(?m)^\s*\d+[.)](?=\s|$)", " ", text)  # list markers are not answers
    out = []
    for a in answers:
        word = rf"(?<![\w.]){re.escape(a.strip())}(?![\w]|\.\d)"
        out.append(re.search(word, text, flags=re.IGNORECASE) is not None)
    return out
