"""`corps bench ops` (bench/ops.py) on a tiny model: a section per prefill and
`step_tokens` setting, counts that follow from the steps, and bad options refused
before anything loads. Counts only: nothing here is timed."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from corps.bench.ops import measure
from corps.cli.app import app

SIZES = dict(prompt=40, spans=3, span_tokens=6, context=12)


async def test_spans_in_one_step_launch_less_than_in_several(tiny_dirs):
    model = str(tiny_dirs["llama"])
    one = await measure(model, "float32", 4096, **SIZES)
    split = await measure(model, "float32", 8, **SIZES)  # 3 spans of 6: one a step
    assert [f.section for f in one] == ["one prompt of 40", "3 spans of 6 over 12 shared"]
    assert one[1].steps == 1 and split[1].steps == 3
    assert split[1].kernels > one[1].kernels  # every step pays its layers' launches again
    assert all(f.kernels > 0 and f.layers > 0 for f in one + split)
    assert one[1].per_step_layer == one[1].kernels / one[1].layers
    assert dict(one[1].ops)["flex_attention"] == one[1].layers  # one launch a layer


@pytest.mark.parametrize("bad", ["abc", "0", "", "4,-1"])
def test_bad_step_tokens_are_refused_before_anything_loads(tiny_dirs, bad):
    result = CliRunner().invoke(
        app, ["bench", "ops", "-m", str(tiny_dirs["llama"]), "--step-tokens", bad]
    )
    assert result.exit_code == 2 and "--step-tokens" in result.output
