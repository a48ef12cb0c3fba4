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


REVIEW = """
async def run(rt, task: str, max_tokens: int = 32, rounds=2):
    return task
"""


@pytest.mark.parametrize(
    ("setting", "says"),
    [
        ("max_token=32", "unknown parameter 'max_token' (valid: task, max_tokens, rounds)"),
        ("task=42", "task: Input should be a valid string (got 42)"),
        ("max_tokens=many", "max_tokens: Input should be a valid integer"),
    ],
)
def test_a_workflow_files_settings_are_checked_by_its_signature_first(tmp_path, setting, says):
    """A `.py` workflow's `--set` typos and wrong types: one line, exit 2, before the
    model loads (a missing model would fail otherwise)."""
    wf = tmp_path / "review.py"
    wf.write_text(REVIEW)
    missing = str(tmp_path / "no-model-here")
    result = runner.invoke(app, ["run", str(wf), "--set", setting, "--model", missing])
    assert result.exit_code == 2, result.output
    assert says in " ".join(result.output.split()) and "Traceback" not in result.output
    assert "no-model-here" not in result.output


def test_a_workflow_file_gets_its_defaults_and_any_key_through_kwargs(tmp_path):
    from corps.cli.scenario import ScenarioError, resolve

    wf = tmp_path / "review.py"
    wf.write_text(REVIEW)
    target = resolve(str(wf))
    got = target.validated({"task": "t", "max_tokens": "7", "answer": "a reference"})
    assert got == {"task": "t", "max_tokens": 7, "rounds": 2}  # converted, defaults in
    with pytest.raises(ScenarioError, match="task: Field required"):
        target.validated({})
    loose = tmp_path / "loose.py"
    loose.write_text("async def run(rt, task, **params):\n    return task\n")
    assert resolve(str(loose)).validated({"task": 1, "other": [2]}) == {"task": 1, "other": [2]}
    hint = tmp_path / "hint.py"
    hint.write_text("async def run(rt, task: 'Nope'):\n    return task\n")
    with pytest.raises(ScenarioError, match=r"run's type hints: NameError"):
        resolve(str(hint))


def test_a_scenario_file_can_name_a_workflow_file_beside_it(tmp_path):
    from corps.cli.scenario import ScenarioError, resolve

    (tmp_path / "review.py").write_text(REVIEW)
    sc = tmp_path / "review.toml"
    sc.write_text('pattern = "review.py"\n[params]\nmax_tokens = 8\n[inputs]\ntask = "t"\n')
    target = resolve(str(sc))
    assert not target.builtin
    assert target.validated(target.params) == {"task": "t", "max_tokens": 8, "rounds": 2}
    bad = tmp_path / "bad.toml"
    bad.write_text('pattern = "missing.py"\n')
    with pytest.raises(ScenarioError, match=r"bad\.toml: pattern: no Python file"):
        resolve(str(bad))
    typo = tmp_path / "typo.toml"
    typo.write_text('pattern = "review.py"\n[params]\nmax_token = 8\n')
    target = resolve(str(typo))
    with pytest.raises(ScenarioError, match=r"unknown parameter params\.'max_token'"):
        target.validated(target.params)
