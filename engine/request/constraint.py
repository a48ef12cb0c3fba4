"""What a constrained decode's text must match: a regex, a JSON schema, choices or a grammar.

`constraint_of(regex=..., json_schema=..., choices=..., grammar=...)` turns the
keywords of `Engine.decode` into one frozen `Constraint` (or None). It is part
of the call's `SamplingParams`, so two calls with different constraints are
never merged as twins. Matching is llguidance's (its regex, JSON-schema and Lark
front ends, compiled per engine in `corps.engine.exec.grammars`): corps has no
regex or schema engine of its own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from corps.engine.errors import InvalidConstraint

Kind = Literal["regex", "json_schema", "choices", "grammar"]
KINDS: tuple[Kind, ...] = ("regex", "json_schema", "choices", "grammar")
#: JSON is written in one layout, as json.dumps does: no free whitespace for a small
#: model to wander into, and more of each object forced (keys, separators).
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class Constraint:
    """One decode's constraint: `kind` and its `source` (the regex, the schema as
    canonical JSON, the choices as a JSON list, or a Lark grammar). A schema given
    as a pydantic model keeps the `model`, which parses the reply (`Handle.value`)."""

    kind: Kind
    source: str
    model: type | None = field(default=None, compare=False, repr=False)

    def parse(self, text: str) -> Any:
        """A JSON-schema reply as a value: an instance of `model`, else the JSON value;
        None for other kinds or text that does not parse."""
        if self.kind != "json_schema":
            return None
        try:
            if self.model is not None:
                return self.model.model_validate_json(text)
            return json.loads(text)
        except ValueError:  # pydantic's ValidationError is a ValueError
            return None

    def grammar(self) -> str:
        """The llguidance grammar this constraint compiles to."""
        from llguidance import LLMatcher

        if self.kind == "regex":
            return LLMatcher.grammar_from_regex(self.source)
        if self.kind == "json_schema":  # one layout: `{"a": 1, "b": [2, 3]}`
            return LLMatcher.grammar_from_json_schema(self.source, defaults=JSON_LAYOUT)
        if self.kind == "choices":
            options = " | ".join(json.dumps(c) for c in json.loads(self.source))
            return LLMatcher.grammar_from_lark(f"start: {options}")
        return LLMatcher.grammar_from_lark(self.source)

    def describe(self) -> str:
        """A short form for messages: `regex 'ANSWER: [0-9]+'`."""
        text = self.source if len(self.source) <= 60 else self.source[:57] + "..."
        return f"{self.kind} {text!r}"


def constraint_of(
    *,
    regex: str | None = None,
    json_schema: Mapping[str, Any] | str | type | None = None,
    choices: Sequence[str] | None = None,
    grammar: str | None = None,
) -> Constraint | None:
    """The constraint of a decode's keywords (at most one given), or None.

    `json_schema` is a dict, its JSON text, or a pydantic model class (its
    `model_json_schema()`); `choices` a list of distinct non-empty strings, one of
    which is the whole text; `grammar` a Lark grammar (llguidance's dialect, with
    a `start` rule). Only shapes are checked here: whether it compiles is checked
    against the engine's tokenizer at submission (`Grammars.check`).
    """
    values = (regex, json_schema, choices, grammar)
    given = {k: v for k, v in zip(KINDS, values, strict=True) if v is not None}
    if not given:
        return None
    if len(given) > 1:
        raise InvalidConstraint(
            f"give one constraint, not {' and '.join(given)}: a decode matches one "
            "regex, json_schema, choices or grammar"
        )
    ((kind, value),) = given.items()
    model = value if isinstance(value, type) and hasattr(value, "model_validate_json") else None
    return Constraint(kind, _source(kind, value), model)


def _source(kind: Kind, value: Any) -> str:
    if kind in ("regex", "grammar"):
        if not isinstance(value, str) or not value:
            raise InvalidConstraint(f"{kind} must be a non-empty string, got {value!r}")
        return value
    if kind == "choices":
        return _choices(value)
    return _schema(value)


def _closed(schema: Any) -> Any:
    """A pydantic model's schema with extra keys closed off where it leaves them open
    (the model ignores them anyway): a reply is the fields, not whatever follows."""
    if isinstance(schema, dict):
        schema = {k: _closed(v) for k, v in schema.items()}
        if schema.get("type") == "object" and "properties" in schema:
            schema.setdefault("additionalProperties", False)
    elif isinstance(schema, list):
        schema = [_closed(v) for v in schema]
    return schema


def _choices(value: Any) -> str:
    if isinstance(value, str) or not isinstance(value, Sequence) or not value:
        raise InvalidConstraint(f"choices must be a non-empty list of strings, got {value!r}")
    if not all(isinstance(c, str) and c for c in value):
        raise InvalidConstraint(f"choices must be non-empty strings, got {value!r}")
    if len(set(value)) != len(value):
        raise InvalidConstraint(f"choices must be distinct, got {value!r}")
    return json.dumps(list(value))


def _schema(value: Any) -> str:
    if isinstance(value, type) and hasattr(value, "model_json_schema"):
        value = _closed(value.model_json_schema())
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise InvalidConstraint(f"json_schema is not JSON: {exc}") from None
    if not isinstance(value, Mapping):
        raise InvalidConstraint(
            f"json_schema must be a JSON schema (a dict, its JSON text or a pydantic model "
            f"class), got {type(value).__name__}"
        )
    return json.dumps(value, separators=(",", ":"))  # key order kept: properties come in it
