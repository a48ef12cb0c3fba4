"""`corps bench mapreduce` (corps.bench.mapreduce): its configurations and table on
a tiny model. Never time."""

from __future__ import annotations

from typer.testing import CliRunner

from corps.bench import mapreduce as bm
from corps.cli.app import app


def test_the_three_configurations_run_the_same_workflow_each_round(tiny_dirs):
    import anyio

    params = dict(document=" ".join(["hello world"] * 200), chunk_tokens=64, max_tokens=4,
                  seed=0)  # fmt: skip
    rows = anyio.run(bm.measure, str(tiny_dirs["llama"]), "float32", params, 2)
    assert [r.config for r in rows] == ["fcfs", "latency caps", "task group"]
    assert all(len(r.walls) == 2 and r.encoded > 0 and r.decoded > 0 for r in rows)
    # same work: the same prompts and seeds (float32: batching changes no token here)
    assert len({r.encoded for r in rows}) == 1
    # the caps bound every step's prompt tokens: more, smaller steps than as a group
    caps, group = rows[1], rows[2]
    assert caps.steps > group.steps


def test_the_command_prints_the_table(tiny_dirs):
    args = ["bench", "mapreduce", "-m", str(tiny_dirs["llama"]), "--dtype", "float32"]
    args += ["--repeat", "1", "--chunk-tokens", "256", "--max-tokens", "4", "--rounds", "1"]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for word in ("fcfs", "latency caps", "task group", "vs latency caps"):
        assert word in result.output


def test_the_caps_are_64_prompt_tokens_whatever_the_kernels_measured():
    from types import SimpleNamespace

    from corps.engine.sched.cost import StepCost
    from corps.engine.sched.policies import ObjectiveFirst

    policy = ObjectiveFirst(latency_rows=2, cost=StepCost())  # as where products were timed
    running = [SimpleNamespace(critical=True, objective="latency", rows=512, keys=0)]
    assert policy.step_budget(running, 512) == 2
    bm.pin_caps(policy)
    assert policy.step_budget(running, 512) == 1 + 64  # its token and 64 prompt tokens
