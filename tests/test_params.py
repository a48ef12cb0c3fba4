"""patterns/params.py: every pattern's parameter ranges are checked before any model loads."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from corps.cli.app import app

runner = CliRunner()

BAD = [
    ("debate", "rounds=0"),
    ("debate", 'question=""'),
    ("parallel-debate", "agents=0"),
    ("parallel-debate", "rounds=-1"),
    ("tree-of-thoughts", "branches=0"),
    ("tree-of-thoughts", "branches=9999999999"),  # built ten billion coroutines (OOM)
    ("parallel-debate", "agents=1025"),
    ("tree-of-thoughts", "voters=0"),
    ("tree-of-thoughts", "vote_tokens=0"),
    ("branch-solve-merge", "concepts=['dog']"),
    ("map-reduce", "fan_in=1"),
    ("map-reduce", "chunk_tokens=4"),
    ("map-reduce", "document="),
    ("multi-qa", "questions=[]"),
    ("prisoners-dilemma", "rounds=0"),
    *[
        (p, s)
        for p in ("debate", "multi-qa")
        for s in ("max_tokens=0", "temperature=-1", "top_p=0")
    ],
    ("tree-of-thoughts", "top_p=1.5"),
]


@pytest.mark.parametrize(("pattern", "setting"), BAD)
def test_a_bad_value_exits_2_in_one_line_before_any_model_loads(tmp_path, pattern, setting):
    missing = str(tmp_path / "no-model-here")  # loading it would fail with another error
    result = runner.invoke(app, ["run", pattern, "--set", setting, "--model", missing])
    assert result.exit_code == 2, result.output
    name = setting.split("=")[0]
    assert name in result.output and "Traceback" not in result.output
    assert "no-model-here" not in result.output  # nothing was loaded


def test_good_values_pass_and_the_listing_shows_the_defaults():
    from corps.patterns import registry

    for fn in registry.PATTERNS.values():
        registry.validate(fn, {})  # the defaults are within their own ranges
    assert registry.validate(registry.PATTERNS["map_reduce"], {"fan_in": 2})["fan_in"] == 2
    result = runner.invoke(app, ["scenarios"], terminal_width=200)
    assert result.exit_code == 0 and "branches=8" in result.output
