"""cli/run_workers.py: `corps run --inputs --workers N` on a local Ray instance."""

from __future__ import annotations

import json
import sys

import pytest
from typer.testing import CliRunner

from corps.cli.app import app

runner = CliRunner()


def _inputs(tmp_path, n: int):
    path = tmp_path / "in.jsonl"
    lines = [dict(id=f"q{i}", questions=["What is 2+2?", f"Say {i}."]) for i in range(n)]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def _args(tiny_dirs, inputs, *more):
    return ["run", "multi_qa", "--inputs", str(inputs), "--model", str(tiny_dirs["llama"]),
            "--dtype", "float32", "--set", "max_tokens=4", "--set", "constrained=false",
            "--seed", "3", *more]  # fmt: skip


@pytest.mark.ray
def test_an_interrupted_run_resumed_runs_only_the_missing_ids(tiny_dirs, tmp_path):
    pytest.importorskip("ray")
    inputs, out, trace = _inputs(tmp_path, 8), tmp_path / "out.jsonl", tmp_path / "t.jsonl"
    args = _args(tiny_dirs, inputs, "--workers", "2", "--json", str(out))
    first = runner.invoke(app, [*args, "--trace", str(trace)])
    assert first.exit_code == 0, first.output
    lines = out.read_text().splitlines()
    assert sorted(json.loads(x)["id"] for x in lines) == [f"q{i}" for i in range(8)]
    from corps.engine.trace.reader import Trace

    assert [p.name for p in Trace.load(trace).processes] == ["worker-1", "worker-2"]
    # as if interrupted: three results, a failure to run again, a line cut short
    failed = json.dumps(dict(json.loads(lines[3]), error="worker died", result=None))
    out.write_text("\n".join(lines[:3]) + "\n" + failed.replace('"result": null, ', "")
                   + "\n" + lines[4][:20])  # fmt: skip
    again = runner.invoke(app, [*args, "--resume"])
    assert again.exit_code == 0, again.output
    said = " ".join(again.output.split())
    assert "3 done, 5 to run" in said and "2 failed or torn lines" in said
    now = out.read_text().splitlines()
    assert now[:3] == lines[:3]  # kept as they were
    ids = [json.loads(x)["id"] for x in now]
    assert sorted(ids) == [f"q{i}" for i in range(8)] and len(set(ids)) == 8
    assert all("result" in json.loads(x) for x in now)


@pytest.mark.parametrize(
    ("more", "says"),
    [
        (["--resume"], "--resume only apply with --workers"),
        (["--workers", "2", "--resume"], "give --json"),
        (["--workers", "2", "--ray", "nowhere"], "bad Ray address 'nowhere'"),
        (["--workers", "2", "--ray", "127.0.0.1:1"], "no Ray cluster answers at 127.0.0.1:1"),
    ],
)
def test_bad_worker_flags_exit_2_in_one_line(tiny_dirs, tmp_path, more, says):
    result = runner.invoke(app, _args(tiny_dirs, _inputs(tmp_path, 2), *more))
    assert result.exit_code == 2, result.output
    assert says in " ".join(result.output.split()) and "Traceback" not in result.output


@pytest.mark.ray
def test_a_worker_that_cannot_load_the_model_exits_2_and_leaves_nothing(tmp_path):
    pytest.importorskip("ray")
    import ray

    args = ["run", "multi_qa", "--inputs", str(_inputs(tmp_path, 2)), "--model",
            str(tmp_path / "no-model"), "--workers", "1"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert "worker-1 failed to start: ModelNotFound" in said and "Traceback" not in said
    assert not ray.is_initialized()  # the local instance it started is gone


def test_workers_need_inputs(tiny_dirs):
    args = ["run", "multi_qa", "--model", str(tiny_dirs["llama"]), "--workers", "2"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and "give --inputs" in result.output


def test_without_ray_installed_the_install_line(tiny_dirs, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now fails
    result = runner.invoke(app, _args(tiny_dirs, _inputs(tmp_path, 2), "--workers", "2"))
    assert result.exit_code == 2, result.output
    assert "pip install 'corps[ray]'" in result.output


def test_duplicate_ids_are_refused_before_anything_starts(tiny_dirs, tmp_path):
    inputs = tmp_path / "dup.jsonl"
    inputs.write_text('{"id": 1}\n{"id": 1}\n')
    result = runner.invoke(app, _args(tiny_dirs, inputs, "--workers", "2"))
    assert result.exit_code == 2 and "appears twice" in result.output
