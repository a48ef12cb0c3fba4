"""`corps bench gpu` (bench/gpu.py): every section on a tiny model on the CPU (the
rehearsal of the GPU run), its JSON lines, and a failing section failing the command.
Structure only: nothing here asserts on a timing."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

import corps.cli.bench_options as app_mod
from corps.bench import gpu as bench_gpu
from corps.bench import gpu_figures
from corps.cli.app import app

TINY = ["--device", "cpu", "--dtype", "float32", "--prompt-tokens", "24", "--spans", "3",
        "--span-tokens", "4", "--context-tokens", "12", "--decode-tokens", "8",
        "--streams", "2,3", "--stream-tokens", "3", "--workflow-tokens", "3", "--runs", "1",
        "--repeats", "1"]  # fmt: skip


def invoke(tiny_dirs, *args):
    model = str(tiny_dirs["llama"])
    return CliRunner().invoke(
        app, ["bench", "gpu", "-m", model, *TINY, *args], env={"COLUMNS": "250"}
    )


def test_every_section_on_a_tiny_model(tiny_dirs, tmp_path):
    out = tmp_path / "gpu.jsonl"
    result = invoke(tiny_dirs, "--workflows", "debate", "--graphs", "static", "--out", str(out),
                    "--patterns", "debate,map-reduce")  # fmt: skip
    assert result.exit_code == 0, result.output
    everything = [json.loads(x) for x in out.read_text().splitlines()]
    # the account's lines per pattern and mode come first, then its figures
    accounts = [x for x in everything if "mode" in x]
    lines = [x for x in everything if "mode" not in x]
    sections = [x["section"] for x in lines]
    assert sections == (
        ["prefill"] * 2 + ["decode"] * 2 + ["streams"] * 2 + ["profile"] * 3 + ["graphs"] * 2
        + ["patterns"] * 7 + ["memory"] * 4 + ["workflows"] * 2 + ["account"] * 6
    )  # fmt: skip
    assert [(x["pattern"], x["mode"]) for x in accounts] == [
        ("debate", "baseline"), ("debate", "choreographed"),
        ("map_reduce", "baseline"), ("map_reduce", "choreographed"),
    ]  # fmt: skip
    for x in accounts:  # every step's forward is in a phase, and counted
        assert x["entries"].get("decode", 0) > 0 and x["launches"].get("decode", 0) > 0
        assert x["device_s"] == {} and x["kernels"] == {}  # CUDA only
    assert "debate: where the time goes" in result.output
    assert not any(x["error"] for x in lines)
    graphs = [x["name"] for x in lines if x["section"] == "graphs"]
    assert graphs == ["one stream, 8 tokens", "2 streams x 3"]  # against graphs="off"
    # memory and the device's busy time: 0 on a CPU
    timed = [x for x in lines if x["section"] not in ("memory", "profile")]
    # a decode rate is a difference of two timings: on a tiny model a busy machine can
    # leave it NaN, which its note then says (no timing is asserted here)
    noisy = [x for x in timed if x["note"] == bench_gpu.NOISE]
    assert all(x["section"] in ("decode", "graphs") for x in noisy)
    assert all(x["corps"] > 0 and x["reference"] > 0 for x in timed if x not in noisy)
    assert {x["name"] for x in lines if x["section"] == "streams"} == {
        "2 streams x 3",
        "3 streams x 3",
    }
    assert "baseline / choreographed wall" in result.output


def test_a_failing_section_fails_the_command_and_the_others_still_run(
    tiny_dirs, tmp_path, monkeypatch
):
    async def broken(engine, hf, s):
        raise RuntimeError("no valid choices")

    monkeypatch.setattr(bench_gpu, "stream_figures", broken)
    out = tmp_path / "gpu.jsonl"
    result = invoke(tiny_dirs, "--workflows", "", "--out", str(out))
    assert result.exit_code == 1
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert {"section": "streams", "error": "RuntimeError('no valid choices')"} in lines
    assert sum(x["section"] == "decode" for x in lines) == 2  # measured all the same


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--workflows", "chess"], "unknown chess"),
        (["--streams", "two"], "invalid literal"),
        (["--sections", "prefill,warp"], "unknown warp"),
        (["--patterns", "debate,chess"], "unknown chess"),
        (["--account-count", "some"], "account-count"),
        (["--memory-budget", "0.1"], "memory-budget"),
        (["--engines", "0"], "engines"),
    ],
)
def test_bad_options_are_refused_before_anything_loads(tiny_dirs, args, says):
    result = invoke(tiny_dirs, *args)
    assert result.exit_code == 2 and says in result.output


def test_the_cli_names_the_workflows_and_sections_the_bench_knows():
    assert app_mod.GPU_WORKFLOWS == tuple(gpu_figures.WORKFLOWS)
    assert app_mod.GPU_SECTIONS == gpu_figures.SECTIONS


def test_a_decode_rate_below_the_timers_noise_is_nan_not_negative():
    assert bench_gpu.per_token(7, 0.5, 0.1) == pytest.approx(17.5)
    for t_n, t_1 in ((0.1, 0.1), (0.1, 0.2)):  # equal, or the longer decode timed shorter
        assert math.isnan(bench_gpu.per_token(7, t_n, t_1))
