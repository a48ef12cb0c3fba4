"""engine/request/constraint.py: decode's constraint keywords as one frozen Constraint."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from corps.engine.errors import InvalidConstraint, InvalidRequest
from corps.engine.request.constraint import Constraint, constraint_of


class Verdict(BaseModel):
    decision: str
    answer: int


def test_no_keyword_is_no_constraint_and_each_kind_has_its_source():
    assert constraint_of() is None
    assert constraint_of(regex="[0-9]+") == Constraint("regex", "[0-9]+")
    assert constraint_of(choices=["A", "B"]) == Constraint("choices", '["A", "B"]')
    assert constraint_of(grammar='start: "x"') == Constraint("grammar", 'start: "x"')


def test_json_schemas_from_a_dict_its_text_or_a_pydantic_model_keep_key_order():
    schema = {"type": "object", "properties": {"z": {"type": "integer"}, "a": {"type": "string"}}}
    from_dict = constraint_of(json_schema=schema)
    assert from_dict == constraint_of(json_schema=json.dumps(schema, indent=2))  # canonical
    assert list(json.loads(from_dict.source)["properties"]) == ["z", "a"]  # generation order
    from_model = constraint_of(json_schema=Verdict)
    closed = {**Verdict.model_json_schema(), "additionalProperties": False}
    assert json.loads(from_model.source) == closed  # replies are the fields, nothing after
    assert from_model.model is Verdict and from_model.parse('{"decision": "x", "answer": 2}')
    assert hash(from_dict) != hash(from_model)  # frozen, hashable: twins compare them


@pytest.mark.parametrize(
    "kwargs, says",
    [
        (dict(regex="[0-9]", choices=["a"]), "give one constraint"),
        (dict(regex=""), "non-empty string"),
        (dict(grammar=3), "non-empty string"),
        (dict(choices="ab"), "non-empty list"),
        (dict(choices=[]), "non-empty list"),
        (dict(choices=["a", ""]), "non-empty strings"),
        (dict(choices=["a", "a"]), "distinct"),
        (dict(json_schema="{not json"), "not JSON"),
        (dict(json_schema=[1, 2]), "must be a JSON schema"),
    ],
)
def test_bad_shapes_are_refused_with_what_to_do(kwargs, says):
    with pytest.raises(InvalidConstraint, match=says) as info:
        constraint_of(**kwargs)
    assert isinstance(info.value, InvalidRequest)  # callers catching InvalidRequest see it


def test_each_kind_compiles_to_an_llguidance_grammar():
    for c in (
        constraint_of(regex="a+"),
        constraint_of(choices=['say "hi"', "bye"]),  # quotes survive the Lark literal
        constraint_of(json_schema={"type": "boolean"}),
        constraint_of(grammar='start: "x" | "y"'),
    ):
        assert isinstance(c.grammar(), str) and c.grammar()
    assert constraint_of(regex="x" * 100).describe().endswith("...'")
