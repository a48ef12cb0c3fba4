"""`corps bench constrained` (bench/constrained.py): its `--patterns` refused before
anything loads when it names no pattern with fixed forms, or none at all."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from corps.bench import constrained as bc
from corps.cli.app import app


@pytest.mark.parametrize("patterns", ["", " , ", "nope", "debate,nope"])
def test_bad_patterns_are_refused_in_a_line(patterns):
    result = CliRunner().invoke(app, ["bench", "constrained", "--patterns", patterns,
                                      "--model", "no-such-model"])  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "--patterns" in result.output and "choose from" in result.output
    assert "Traceback" not in result.output


def test_the_patterns_it_takes_are_those_with_fixed_forms():
    from corps.cli.bench_options import pattern_names

    assert pattern_names(None, bc.PATTERNS) == tuple(bc.PATTERNS)
    first = next(iter(bc.PATTERNS))
    assert pattern_names(first.replace("_", "-"), bc.PATTERNS) == (first,)
