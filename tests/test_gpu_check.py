""".ci/gpu-check, the device check, rehearsed on the CPU with a tiny model so it
cannot rot between GPU sessions: its stages, their JSON lines, the bench's figures
of every section, and a failing or timed-out stage failing the check.
Structure only: nothing here asserts on a timing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ("--dtype float32 --prompt-tokens 24 --spans 3 --span-tokens 4 --context-tokens 12 "
        "--decode-tokens 8 --streams 2 --stream-tokens 3 --workflow-tokens 3 --runs 1 "
        "--repeats 1 --workflows debate --graphs static --engines 2")  # fmt: skip
QUICK_TEST = (
    "tests/test_bench_gpu.py::test_the_cli_names_the_workflows_and_sections_the_bench_knows"
)


def check(out: Path, **env: str) -> subprocess.CompletedProcess:
    base = {
        "GPU_CHECK_INSTALL": "0",
        "GPU_CHECK_DEVICE": "cpu",
        "GPU_CHECK_TESTS": QUICK_TEST,
        "GPU_CHECK_BENCH": TINY,
        "PYTHON": sys.executable,
    }
    return subprocess.run(
        ["bash", str(ROOT / ".ci" / "gpu-check"), str(out)],
        env={**os.environ, **base, **env},
        capture_output=True,
        text=True,
        timeout=600,
    )


def _file(model: str) -> str:
    return "".join(c if c.isalnum() or c in ".-" else "_" for c in model)


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_every_stage_and_section_on_a_tiny_model(tiny_dirs, tmp_path):
    model = str(tiny_dirs["llama"])
    out = tmp_path / "out"
    done = check(out, GPU_CHECK_MODELS=f"{model}; tests; {model} --sections prefill,memory",
                 GPU_CHECK_BENCH_S="300 200")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    stages = lines(out / "check.jsonl")
    # the tests where the list names them; each bench under its own limit
    assert [s["stage"] for s in stages] == ["env", f"bench-1-{_file(model)}", "tests",
                                            f"bench-2-{_file(model)}"]  # fmt: skip
    assert [s["rc"] for s in stages] == [0, 0, 0, 0]
    assert [s["limit_s"] for s in stages if s["stage"].startswith("bench")] == [300, 200]
    assert "check: passed" in done.stdout
    first, second = out / f"bench-1-{_file(model)}.jsonl", out / f"bench-2-{_file(model)}.jsonl"
    sections = [x["section"] for x in lines(first)]
    assert set(sections) == {
        "prefill", "decode", "streams", "profile", "graphs", "workflows", "patterns", "memory",
        "account",
    }  # fmt: skip
    assert not any(x.get("error") for x in lines(first))
    patterns = [x for x in lines(first) if x["section"] == "patterns"]
    assert len(patterns) == 7 and all(not x["error"] for x in patterns)
    assert sum(s == "memory" for s in sections) == 2  # --engines 2
    assert {x["section"] for x in lines(second)} == {"prefill", "memory"}  # its own options


def test_a_failing_stage_fails_the_check_and_the_next_still_runs(tiny_dirs, tmp_path):
    model = str(tiny_dirs["llama"])
    out = tmp_path / "out"
    done = check(out, GPU_CHECK_MODELS=f"no-such-model-dir/; {model} --sections prefill")
    assert done.returncode == 1
    stages = lines(out / "check.jsonl")
    assert [s["rc"] != 0 for s in stages] == [False, True, False, False]  # env, 2 benches, tests
    assert "check: FAILED" in done.stdout


def test_a_check_out_of_time_skips_what_is_left_and_fails(tiny_dirs, tmp_path):
    out = tmp_path / "out"
    done = check(out, GPU_CHECK_BUDGET_S="5", GPU_CHECK_MODELS=str(tiny_dirs["llama"]))
    assert done.returncode == 1
    assert all(s.get("skipped") == "out of time" for s in lines(out / "check.jsonl"))


def test_the_install_maps_every_package_folder_the_wheel_has():
    """The GPU machine runs corps from symlinked folders; one left out fails every bench
    there (the H200 run of 2026-11-28 lost its first try to a missing `bench`)."""
    import re

    script = (ROOT / ".ci" / "gpu-check").read_text()
    expr = re.search(r"for d in \$\((sed .*?)\); do", script).group(1)
    mapped = subprocess.run(["bash", "-c", expr], cwd=ROOT, capture_output=True, text=True)
    setup = (ROOT / "setup.py").read_text()
    roots = re.search(r"^ROOTS = \((.*)\)$", setup, re.M).group(1)
    assert mapped.stdout.split() == [r.strip(' "') for r in roots.split(",") if r.strip()]
    assert {"bench", "serve"} <= set(mapped.stdout.split())
