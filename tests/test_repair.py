"""engine/repair.py: repair policies from their strings, and back."""

from __future__ import annotations

import pytest

from corps.engine.errors import InvalidRequest
from corps.engine.repair import NONE, Repair, parse_repair


@pytest.mark.parametrize(
    ("text", "want", "canonical"),
    [
        ("none", Repair(), "none"),
        ("", Repair(), "none"),
        ("first:4", Repair(first=4), "first:4"),
        ("recompute:0.15", Repair(ratio=0.15), "recompute:0.15"),
        ("full", Repair(full=True), "full"),
        ("recompute:1", Repair(full=True), "full"),
        (" First:4 + recompute:0.10 ", Repair(first=4, ratio=0.1), "first:4+recompute:0.1"),
        ("temp:0.8", Repair(temperature=0.8), "temp:0.8"),
        ("first:4+temp:1.25", Repair(first=4, temperature=1.25), "first:4+temp:1.25"),
        ("full+temp:0.5", Repair(full=True), "full"),
        ("serial", Repair(serial=True), "serial"),
        ("full+serial", Repair(full=True, serial=True), "serial+full"),
        ("serial+recompute:0.15", Repair(ratio=0.15, serial=True), "serial+recompute:0.15"),
        ("query:0.3", Repair(query=0.3), "query:0.3"),
        ("first:4+query:0.1", Repair(first=4, query=0.1), "first:4+query:0.1"),
        ("query:1", Repair(full=True), "full"),
    ],
)
def test_policies_parse_to_their_canonical_form(text, want, canonical):
    if not text:
        text = "none"
    got = parse_repair(text)
    assert got == want and str(got) == canonical
    assert parse_repair(str(got)) == got


def test_what_a_policy_needs():
    assert NONE.none and parse_repair(None) is NONE and not NONE.probes
    assert parse_repair("recompute:0.3").probes and not parse_repair("first:2").probes
    assert not parse_repair("full").probes and not parse_repair("recompute:0").probes
    assert parse_repair("recompute:0").none  # a share of nothing recomputes nothing
    assert not parse_repair("temp:0.8").none and parse_repair("temp:1").none
    assert parse_repair("serial").none  # it lays the context out and recomputes nothing
    assert parse_repair("query:0.3").probes and parse_repair("query:0.3").share == 0.3
    assert parse_repair("query:0").none


@pytest.mark.parametrize(
    "bad",
    [
        "all",
        "first",
        "first:x",
        "serial:1",
        "recompute:1.5",
        "first:-1",
        "full:2",
        "temp:0",
        3,
        "query:2",
        "query",
        "recompute:0.1+query:0.2",
        "auto:",
        "auto:auto",
        "auto:temp:0.8",  # not a rung of auto's ladder
        "auto:query:0.2",
        "auto+full",
        "\udcff",
    ],
)
def test_bad_policies_say_what_they_take(bad):
    with pytest.raises(InvalidRequest, match="repair"):
        parse_repair(bad)


def test_auto_may_name_where_its_new_keys_start():
    """ "auto:P" is auto whose keys not seen yet start at rung P of its ladder."""
    from corps.engine.repair import AUTO, LADDER

    got = parse_repair(" Auto: Query:0.30 ")
    assert got.auto and got.start == parse_repair("query:0.3") and got.none
    assert str(got) == "auto:query:0.3" and parse_repair(str(got)) == got
    assert parse_repair("auto:none") is AUTO and str(AUTO) == "auto"
    assert all(parse_repair(f"auto:{p}").start in (None, p) for p in LADDER)
    with pytest.raises(InvalidRequest, match="rung of its ladder"):
        Repair(first=4, start=parse_repair("full"))  # a start without auto
