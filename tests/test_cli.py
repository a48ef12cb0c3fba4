"""The `corps` command line (corps.cli.app)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corps.cli.app import app

runner = CliRunner()


def test_models_lists_the_default_alias(tmp_path, monkeypatch):
    monkeypatch.setenv("CORPS_HOME", str(tmp_path))
    result = runner.invoke(app, ["models"])
    assert result.exit_code == 0 and "smollm2-135m" in result.output


def test_chat_errors_are_one_line(tmp_path):
    result = runner.invoke(app, ["chat", "hi", "--model", str(tmp_path / "missing")])
    assert result.exit_code == 1
    assert "error:" in result.output and "Traceback" not in result.output


async def _greedy_answer(path, question: str, n: int) -> str:
    from corps.engine import Engine

    async with Engine.open(str(path), capacity=4096) as engine:
        q = await engine.prefill(question)
        return (await engine.decode(parents=[q], max_tokens=n)).text


def test_chat_streams_the_models_answer(tiny_dirs):
    import anyio

    want = anyio.run(_greedy_answer, tiny_dirs["llama"], "hello world", 5)
    result = runner.invoke(
        app, ["chat", "hello world", "--model", str(tiny_dirs["llama"]), "--max-tokens", "5"]
    )
    assert result.exit_code == 0, result.output
    assert want and result.output == want + "\n"


def test_chat_compile_streams_the_eager_answer(tiny_dirs):
    import anyio

    want = anyio.run(_greedy_answer, tiny_dirs["llama"], "hello world", 12)
    args = ["chat", "hello world", "--model", str(tiny_dirs["llama"]), "--max-tokens", "12"]
    result = runner.invoke(app, [*args, "--compile"])
    assert result.exit_code == 0, result.output
    assert want and result.output.endswith(want + "\n")
    result = runner.invoke(app, [*args, "--compile", "--mode", "hf"])
    assert result.exit_code == 2 and "compile" in result.output


# ---- corps run / corps scenarios ----

EXAMPLES = Path(__file__).parent.parent / "examples"


def run_cli(tiny_dirs, *args: str):
    return runner.invoke(app, ["run", *args, "--model", str(tiny_dirs["llama"])])


def test_scenarios_lists_every_pattern():
    from corps.patterns import PATTERNS

    result = runner.invoke(app, ["scenarios"], terminal_width=200)
    assert result.exit_code == 0
    for name in PATTERNS:
        assert name.replace("_", "-") in result.output
    assert "branches=8" in result.output


def test_run_a_builtin_prints_answer_and_summary(tiny_dirs, tmp_path):
    out = tmp_path / "r.json"
    result = run_cli(
        tiny_dirs,
        "tree-of-thoughts",
        "--set",
        "branches=3",
        "--set",
        "voters=2",
        "--set",
        "max_tokens=4",
        "--seed",
        "1",
        "--json",
        str(out),
    )
    assert result.exit_code == 0, result.output
    assert "answer:" in result.output and "reused" in result.output and "leaks" in result.output
    data = json.loads(out.read_text())
    assert data["pattern"] == "tree_of_thoughts" and data["mode"] == "choreographed"
    assert len(data["messages"]) == 3 + 3 + 2 + 3 and "text" in data["messages"][0]


@pytest.mark.parametrize("mode", ["baseline", "hf"])
def test_run_other_modes(tiny_dirs, mode):
    result = run_cli(tiny_dirs, "multi-qa", "--set", "max_tokens=4", "--mode", mode)
    assert result.exit_code == 0, result.output
    assert mode in result.output


def test_run_bad_input_exits_2_with_one_line(tiny_dirs, tmp_path):
    cases = [
        (["tree-of-thought"], "no pattern named"),
        (["debate", "--set", "roundz=2"], "unknown parameter 'roundz'"),
        (["debate", "--set", "rounds=lots"], "rounds"),
        (["debate", "--set", "rounds"], "key=value"),
        (["debate", "--mode", "fast"], "--mode"),
        (["tree-of-thoughts", "--decision-repair", "some"], "decision_repair"),
        (["tree-of-thoughts", "--decision-repair", "query:7"], "decision_repair"),
        (["tree-of-thoughts", "--repair", "\udcff"], "repair"),
    ]
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text('pattern = "debate"\n[params]\nrounds = "x"\n')
    cases.append(([str(bad_toml)], "params.rounds"))
    no_run = tmp_path / "wf.py"
    no_run.write_text("x = 1\n")
    cases.append(([str(no_run)], "defines no `async def run"))
    for args, message in cases:
        result = run_cli(tiny_dirs, *args)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output.replace("\n", " ") and "Traceback" not in result.output


def test_run_a_failed_workflow_exits_1(tiny_dirs):
    result = run_cli(
        tiny_dirs, "prisoners-dilemma", "--set", "max_tokens=4", "--leak-policy", "deny"
    )
    assert result.exit_code == 1
    assert "workflow failed" in result.output and "leak_policy='deny'" in result.output


def test_run_every_example_scenario_parses():
    from corps.cli.scenario import resolve

    files = sorted((EXAMPLES / "scenarios").glob("*.toml"))
    assert len(files) == 7
    for f in files:
        target = resolve(str(f))
        target.validated(target.params)


def test_run_a_scenario_file(tiny_dirs):
    result = run_cli(
        tiny_dirs, str(EXAMPLES / "scenarios" / "multi_qa.toml"), "--set", "max_tokens=4"
    )
    assert result.exit_code == 0, result.output


def test_run_a_python_file(tiny_dirs):
    result = run_cli(tiny_dirs, str(EXAMPLES / "custom_workflow.py"), "--set", 'question="hi"')
    assert result.exit_code == 0, result.output
    assert "verdict" in result.output


def test_run_many_inputs_concurrently(tiny_dirs, tmp_path):
    out = tmp_path / "runs.jsonl"
    result = run_cli(
        tiny_dirs,
        "parallel-debate",
        "--inputs",
        str(EXAMPLES / "questions.jsonl"),
        "--concurrency",
        "2",
        "--set",
        "max_tokens=4",
        "--set",
        "rounds=2",
        "--json",
        str(out),
    )
    assert result.exit_code == 0, result.output
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["index"] for x in lines] == [0, 1, 2, 3]
    questions = [json.loads(x)["question"] for x in (EXAMPLES / "questions.jsonl").open()]
    for x, q in zip(lines, questions, strict=True):
        assert q in x["result"]["messages"][0]["text"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "a"}\n{"rounds": "x"}\n')
    result = run_cli(tiny_dirs, "parallel-debate", "--inputs", str(bad))
    assert result.exit_code == 2 and "line 2" in result.output


@pytest.mark.parametrize("mode", ["choreographed", "hf"])
def test_run_with_a_trace_then_view_and_export_it(tiny_dirs, tmp_path, mode):
    trace = tmp_path / "t.jsonl"
    result = run_cli(
        tiny_dirs, "multi-qa", "--set", "max_tokens=4", "--mode", mode, "--trace", str(trace)
    )
    assert result.exit_code == 0, result.output
    view = runner.invoke(app, ["trace", "view", str(trace)], terminal_width=100)
    assert view.exit_code == 0, view.output
    assert "timeline" in view.output and "KV lineage" in view.output and mode in view.output
    for name in ("2", "c2"):
        detail = runner.invoke(app, ["trace", "view", str(trace), "--call", name, "--full"])
        assert detail.exit_code == 0 and "call c2" in detail.output
    outs = {k: tmp_path / f"o.{k}" for k in ("perfetto", "otel", "svg", "html")}
    args = [x for k, p in outs.items() for x in (f"--{k}", str(p))]
    export = runner.invoke(app, ["trace", "export", str(trace), *args])
    assert export.exit_code == 0, export.output
    assert all(p.stat().st_size > 0 for p in outs.values())
    assert "traceEvents" in json.loads(outs["perfetto"].read_text())
    diff = runner.invoke(app, ["trace", "diff", str(trace), str(trace)], terminal_width=120)
    assert diff.exit_code == 0 and "same text" in diff.output


def test_trace_commands_fail_clearly(tmp_path, traces):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("hello\n")
    for args in (
        ["trace", "view", str(bad)],
        ["trace", "view", str(tmp_path / "missing.jsonl")],
        ["trace", "view", str(traces["debate"]), "--call", "999999"],
        ["trace", "view", str(traces["debate"]), "--call", "m3"],
        ["trace", "view", str(traces["debate"]), "--kind", "bogus"],
        ["trace", "export", str(traces["debate"])],
        ["trace", "diff", str(traces["debate"]), str(bad)],
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert "error:" in result.output and "Traceback" not in result.output


def test_run_live_draws_and_still_prints_the_summary(tiny_dirs):
    result = run_cli(tiny_dirs, "prisoners-dilemma", "--set", "max_tokens=4", "--live")
    assert result.exit_code == 0, result.output
    assert "answer:" in result.output and "calls" in result.output
    # off a terminal rich draws only the last frame, which stays: what ran, its outputs
    assert "prisoners_dilemma" in result.output and "finished in" in result.output
    assert "(last output)" in result.output


def test_run_live_keeps_failures_typed(tiny_dirs):
    result = run_cli(
        tiny_dirs, "prisoners-dilemma", "--set", "max_tokens=4", "--leak-policy", "deny", "--live"
    )
    assert result.exit_code == 1, result.output
    assert "workflow failed" in result.output and "leak_policy='deny'" in result.output


def test_follow_on_a_finished_trace_draws_and_ends(traces):
    result = runner.invoke(app, ["trace", "view", str(traces["debate"]), "--follow"])
    assert result.exit_code == 0, result.output
    assert "timeline" in result.output and "message graph" in result.output


@pytest.mark.parametrize("args", [["--mode", "weird"], ["--dtype", "int8"]])
def test_chat_rejects_bad_options_before_loading_a_model(tmp_path, args):
    result = runner.invoke(app, ["chat", "hi", "--model", str(tmp_path / "missing"), *args])
    assert result.exit_code == 2, result.output
    assert "must be one of" in result.output and "missing" not in result.output


def test_a_named_repair_turns_the_decision_steps_default_off():
    """--repair applies to every call (`--repair none`: plain choreography); without
    it the decision steps get --decision-repair, or the engine's default."""
    from corps.cli.options import repair_fields
    from corps.engine import DECISION_REPAIR, EngineConfig

    assert EngineConfig.of(**repair_fields(None, None)).decision_repair == DECISION_REPAIR
    assert repair_fields("none", None) == dict(repair="none", decision_repair="none")
    assert repair_fields("full", "first:2") == dict(repair="full", decision_repair="none")
    assert repair_fields(None, "full") == dict(decision_repair="full")
    assert repair_fields("auto", None) == dict(repair="auto")  # decision steps start higher
    assert repair_fields("auto", "none") == dict(repair="auto", decision_repair="none")


def test_run_says_how_many_tokens_a_repair_recomputed(tiny_dirs):
    """The voters' decision repair is on by default: the summary says what it
    recomputed; with --decision-repair none there is nothing to say."""
    args = ["tree-of-thoughts", "--set", "branches=3", "--set", "voters=2",
            "--set", "max_tokens=4", "--set", "vote_tokens=2"]  # fmt: skip
    result = run_cli(tiny_dirs, *args)
    assert result.exit_code == 0, result.output
    assert "recomputed rewired context" in result.output
    result = run_cli(tiny_dirs, *args, "--decision-repair", "none")
    assert result.exit_code == 0, result.output
    assert "recomputed rewired context" not in result.output


def test_run_says_what_the_baseline_bound_cut_and_lifts_it_when_asked(tiny_dirs):
    """Full repairs of the voters: capped at what the baseline would encode, the
    summary says how many tokens the cap cut; with --no-repair-bound nothing is cut."""
    args = ["tree-of-thoughts", "--set", "branches=3", "--set", "voters=2", "--set",
            "max_tokens=4", "--set", "vote_tokens=2", "--decision-repair", "full"]  # fmt: skip
    capped = run_cli(tiny_dirs, *args)
    assert capped.exit_code == 0, capped.output
    assert "more cut: the baseline would not encode them" in " ".join(capped.output.split())
    free = run_cli(tiny_dirs, *args, "--no-repair-bound")
    assert free.exit_code == 0, free.output
    assert "recomputed rewired context" in free.output and "cut" not in free.output


WORKFLOW_ERRORS = {
    # an agent's own exception: its type kept, the agent named
    "key": (
        "from corps.agents import Agent\n"
        "class Judge(Agent):\n"
        "    async def handle(self, msg):\n"
        "        return {}['verdict']\n"
        "async def run(rt):\n"
        "    await rt.spawn(Judge, 'judge')\n"
        "    q = await rt.engine.prefill('hi')\n"
        "    return await rt.ask('judge', q)\n",
        "agent 'judge' failed on",
        "KeyError: 'verdict'",
    ),
    # two agents asked in a task group, both failing: the first cause, not the group
    "group": (
        "import anyio\n"
        "from corps.agents import Agent\n"
        "class Bad(Agent):\n"
        "    async def handle(self, msg):\n"
        "        raise ValueError('no verdict')\n"
        "async def run(rt):\n"
        "    await rt.spawn(Bad, 'a')\n"
        "    await rt.spawn(Bad, 'b')\n"
        "    q = await rt.engine.prefill('hi')\n"
        "    async with anyio.create_task_group() as tg:\n"
        "        tg.start_soon(rt.ask, 'a', q)\n"
        "        tg.start_soon(rt.ask, 'b', q)\n",
        "ValueError: no verdict",
        "failed on",
    ),
    # an ask past its timeout: the agent, the message and the timeout named
    "timeout": (
        "import anyio\n"
        "from corps.agents import Agent\n"
        "class Slow(Agent):\n"
        "    async def handle(self, msg):\n"
        "        await anyio.sleep_forever()\n"
        "async def run(rt):\n"
        "    await rt.spawn(Slow, 'slow')\n"
        "    q = await rt.engine.prefill('hi')\n"
        "    return await rt.ask('slow', q, timeout=0.05)\n",
        "ask to agent 'slow'",
        "no reply within 0.05 s",
    ),
}


@pytest.mark.parametrize("case", sorted(WORKFLOW_ERRORS))
def test_a_workflows_error_is_one_line_from_the_real_command(tiny_dirs, tmp_path, case):
    """`corps run FILE.py` as a user runs it (a subprocess): the error is one line on
    stderr, exit 1, with the cause's type and the way to the traceback."""
    import os
    import subprocess
    import sys

    code, *says = WORKFLOW_ERRORS[case]
    wf = tmp_path / f"{case}.py"
    wf.write_text(code)
    env = {k: v for k, v in os.environ.items() if k != "CORPS_DEBUG"}
    proc = subprocess.run(
        [sys.executable, "-m", "corps.cli.app", "run", str(wf), "--model", str(tiny_dirs["llama"])],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    lines = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert proc.returncode == 1, proc.stderr
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for part in says:
        assert part in lines[0], lines[0]
    assert "CORPS_DEBUG=1" in lines[0]


LEAKY = (
    "from corps.agents import Agent\n"
    "class Writer(Agent):\n"
    "    system = 'A private brief.'\n"
    "    async def handle(self, msg):\n"
    "        return await self.decode(parents=[self.system_prompt, msg], max_tokens=4)\n"
    "class Reader(Agent):\n"
    "    system = 'Another brief.'\n"
    "    async def handle(self, msg):\n"
    "        return await self.decode(parents=[self.system_prompt, msg], max_tokens=4)\n"
    "async def run(rt, question: str = 'hi') -> str:\n"
    "    await rt.spawn(Writer, 'writer')\n"
    "    await rt.spawn(Reader, 'reader')\n"
    "    q = await rt.engine.prefill(question)\n"
    "    draft = await rt.ask('writer', q)\n"
    "    return (await rt.ask('reader', draft)).text\n"
)


def test_a_workflow_file_gets_the_summary_and_its_leaks_said(tiny_dirs, tmp_path):
    """No hand-filled result: the engine's own counters, and the leak (the reader
    attends to the writer's reply, encoded over the writer's private brief)."""
    wf = tmp_path / "review.py"
    wf.write_text(LEAKY)
    result = run_cli(tiny_dirs, str(wf))
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "answer:" in text and "tokens encoded" in text and "review.py" in text
    assert "1 leak(s)" in text and "--leak-policy reencode" in text
    # which call, which message, whose hidden prompt; and the fix, never a text
    assert "decode by reader attends to message" in text and "(writer's assistant)" in text
    assert "(writer's system)" in text and "visibility=Public()" in text
    assert "A private brief" not in text
    clean = run_cli(tiny_dirs, str(wf), "--leak-policy", "reencode")
    assert clean.exit_code == 0 and "leak(s)" not in clean.output


def test_run_with_a_store_records_and_continues_a_run(tiny_dirs, tmp_path):
    """`corps run ... --store DIR --run NAME` twice: the second replays every call the
    first finished and prints the same answer."""
    args = ["multi-qa", "--set", "max_tokens=6", "--seed", "3", "--store", str(tmp_path / "s"),
            "--run", "r1", "--no-live"]  # fmt: skip
    first = run_cli(tiny_dirs, *args, "--json", str(tmp_path / "a.json"))
    assert first.exit_code == 0, first.output
    assert "as run 'r1'" in " ".join(first.output.split())
    again = run_cli(tiny_dirs, *args, "--json", str(tmp_path / "b.json"))
    assert again.exit_code == 0, again.output
    a, b = (json.loads((tmp_path / f).read_text()) for f in ("a.json", "b.json"))
    # the same messages, ids included: every call was answered from the store (a run
    # that ran them again would have made new messages, under new ids)
    assert a["answer"] == b["answer"] and a["messages"] == b["messages"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--run", "r1"], "--run: a run's name needs a store"),
        (["--store", "S", "--inputs", "I"], "--store: it records a single run"),
    ],
)
def test_run_store_flags_are_checked_first(tiny_dirs, tmp_path, args, says):
    (tmp_path / "I").write_text('{"questions": ["a"]}\n')
    args = [a if a not in ("S", "I") else str(tmp_path / a) for a in args]
    result = run_cli(tiny_dirs, "multi-qa", *args)
    assert result.exit_code == 2 and says in result.output, result.output
