"""`corps fidelity`, `eval`, `distill`, `inputs` (cli/fidelity.py, cli/distill.py), tiny model."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from corps.cli.app import app

runner = CliRunner()
FREE = ["--set", "constrained=false", "--set", "max_tokens=6"]


def _invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture
def pairs(tmp_path):
    path = tmp_path / "pairs.jsonl"
    assert _invoke("inputs", "multi-qa", "--n", 8, "--seed", 2, "-o", path).exit_code == 0
    return path


def test_inputs_writes_lines_or_says_what_it_knows(tmp_path, pairs):
    lines = [json.loads(x) for x in pairs.read_text().splitlines()]
    assert len(lines) == 8 and set(lines[0]) == {"id", "questions", "answers"}
    bad = _invoke("inputs", "trivia")
    assert bad.exit_code == 2 and "no input kind 'trivia'" in bad.output


def test_fidelity_eval_and_distill_end_to_end(tiny_dirs, tmp_path, pairs):
    model = tiny_dirs["llama"]
    common = ["--model", model, *FREE, "--set", "layout=parallel"]
    fid = _invoke("fidelity", "multi-qa", "--inputs", pairs, "--n", 3, *common,
                  "--json", tmp_path / "f.json")  # fmt: skip
    assert fid.exit_code == 0, fid.output
    assert "baseline vs choreographed (3 runs, float32)" in fid.output
    rows = json.loads((tmp_path / "f.json").read_text())["replays"]["choreographed"]
    assert [r["role"] for r in rows] == ["answerer", "all"] and rows[-1]["turns"] == 3

    out = tmp_path / "adapter"
    dist = _invoke("distill", "multi-qa", "--inputs", pairs, "--train", 4, "--val", 2,
                   "--epochs", 1, "--rank", 2, "--alpha", 4, "--targets", "attention",
                   "--out", out, *common)  # fmt: skip
    assert dist.exit_code == 0, dist.output
    assert "validation gap" in dist.output and "kept epoch" in dist.output
    assert "training gap" in dist.output and "train gap" in dist.output
    assert (out / "adapter_config.json").exists() and (out / "traces.jsonl").exists()
    config = json.loads((out / "adapter_config.json").read_text())
    assert set(config["target_modules"]) == {"q_proj", "k_proj", "v_proj", "o_proj"}

    fid2 = _invoke("fidelity", "multi-qa", "--inputs", pairs, "--n", 2, "--adapter", out,
                   *common)  # fmt: skip
    assert fid2.exit_code == 0, fid2.output
    for label in ("choreographed", "choreographed+adapter", "baseline+adapter"):
        assert f"baseline vs {label} (2 runs" in fid2.output

    ev = _invoke("eval", "multi-qa", "--inputs", pairs, "--n", 4, "--model", model, *FREE,
                 "--configs", f"baseline,choreographed,choreographed+{out}",
                 "--json", tmp_path / "e.json")  # fmt: skip
    assert ev.exit_code == 0, ev.output
    report = json.loads((tmp_path / "e.json").read_text())
    assert list(report["configs"]) == ["baseline", "choreographed", f"choreographed+{out}"]
    assert report["configs"]["choreographed"]["vs_first"]["test"] == "mcnemar"
    assert all(isinstance(s, bool) for s in report["configs"]["baseline"]["scores"])


def test_bad_inputs_are_one_line_and_exit_2(tiny_dirs, tmp_path, pairs):
    model = tiny_dirs["llama"]
    (tmp_path / "empty.jsonl").write_text("\n")
    cases = [
        (["fidelity", "multi-qa", "--adapter", tmp_path / "none"],
         "--adapter: adapter: not a directory"),
        (["fidelity", "multi-qa", "--inputs", tmp_path / "empty.jsonl"], "has no inputs"),
        (["eval", "debate", "--inputs", pairs], "unknown parameter 'questions'"),
        (["eval", "map-reduce", "--inputs", pairs], "no task score for map_reduce"),
        (["eval", "multi-qa", "--inputs", pairs, "--configs", "hf"], "a configuration is baseline"),
        (["distill", "multi-qa", "--inputs", pairs, "--train", 8, "--val", 2, "--out", tmp_path],
         "needs 10"),
        (["distill", "multi-qa", "--inputs", pairs, "--train", 1, "--val", 1, "--out", tmp_path,
          "--targets", "attn"], "targets must be some of q_proj"),
    ]  # fmt: skip
    for args, says in cases:
        r = _invoke(*args, "--model", model)
        assert r.exit_code == 2, (args, r.output)
        assert says in " ".join(r.output.split()), (args, r.output)


def test_an_adapter_of_another_rank_or_model_fails_before_loading(tiny_dirs, tmp_path):
    from corps.engine.model.adapter_files import trainable

    from helpers import hf_model

    trainable(hf_model(tiny_dirs["qwen3"]), rank=2, alpha=4).save_pretrained(str(tmp_path / "q"))
    for command in (["fidelity", "multi-qa"], ["run", "multi-qa"], ["chat", "hi"]):
        r = _invoke(*command, "--model", tiny_dirs["llama"], "--adapter", tmp_path / "q")
        assert r.exit_code == 2, (command, r.output)
        assert "another" in r.output, r.output


def test_fidelity_and_eval_take_repair_policies(tiny_dirs, tmp_path, pairs):
    """--repair replays (or scores) one choreographed configuration per policy and
    prints the curve; on the serial layout "full" reads what the baseline reads."""
    pytest.importorskip("matplotlib")
    common = ["--model", tiny_dirs["llama"], *FREE, "--set", "layout=serial"]
    fid = _invoke("fidelity", "multi-qa", "--inputs", pairs, "--n", 2, *common,
                  "--repair", "none,first:2,full", "--json", tmp_path / "f.json",
                  "--plot", tmp_path / "curve.png")  # fmt: skip
    assert fid.exit_code == 0, fid.output
    assert "fidelity against cost (2 runs, float32)" in fid.output
    report = json.loads((tmp_path / "f.json").read_text())
    replays = report["replays"]
    assert list(replays) == ["choreographed@none", "choreographed@first:2", "choreographed@full"]
    assert abs(replays["choreographed@full"][-1]["gap"]) < 1e-4
    assert replays["choreographed@none"][-1]["tokens_repaired"] == 0
    assert replays["choreographed@full"][-1]["recomputed"] > 0
    full = replays["choreographed@full"][-1]  # its cost against the baseline's own work
    assert full["baseline_context_tokens"] > 0 and full["of_baseline_work"] == pytest.approx(
        full["tokens_repaired"] / full["baseline_context_tokens"]
    )
    assert replays["choreographed@none"][-1]["of_baseline_work"] == 0.0
    assert "of baseline's work" in fid.output and "over: the calls" in fid.output
    workflows = report["workflows"]
    none, full = workflows["choreographed@none"], workflows["choreographed@full"]
    assert [w["index"] for w in none] == [0, 1]
    # the warm-up's prefixes forgotten: the baseline's first input encodes its prompt
    assert all(w["baseline_encoded"] > 0 and w["replay_encoded"] > 0 for w in none)
    # same tokens, same calls: a replay's workflows differ by the tokens it repaired
    repaired = replays["choreographed@full"][-1]["tokens_repaired"]
    assert (
        sum(w["replay_encoded"] for w in full) - sum(w["replay_encoded"] for w in none) == repaired
    )
    assert replays["choreographed@none"][-1]["calls_over_baseline_work"] == 0
    assert replays["choreographed@full"][-1]["baseline_ttft_s"] > 0
    assert "as it sampled them" in fid.output  # the TTFT / baseline column's legend
    assert set(report["wall_s"]) == {"baseline", *replays}
    assert (tmp_path / "curve.png").stat().st_size > 0

    ev = _invoke("eval", "multi-qa", "--inputs", pairs, "--n", 2, *common, "--dtype", "float32",
                 "--repair", "full,auto", "--audit", 1, "--audit-budget", 1,
                 "--json", tmp_path / "e.json", "--plot", tmp_path / "scores.png")  # fmt: skip
    assert ev.exit_code == 0, ev.output
    assert "what each configuration cost" in ev.output and "of baseline's work" in ev.output
    configs = json.loads((tmp_path / "e.json").read_text())["configs"]
    assert list(configs) == ["baseline", "choreographed", "choreographed@full",
                             "choreographed@auto"]  # fmt: skip
    plain, full = configs["choreographed"], configs["choreographed@full"]
    assert plain["tokens_repaired"] == 0 and plain["recomputed"] == 0.0
    assert full["tokens_repaired"] > 0 and 0.0 < full["recomputed"] < 1.0
    # the cost against the baseline's own work: repairs and audits over its context tokens
    base = configs["baseline"]
    work = base["tokens_encoded"] - base["tokens_generated"]
    for c in (plain, full, configs["choreographed@auto"]):
        want = (c["tokens_repaired"] + c["audit_tokens"]) / work
        assert c["of_baseline_work"] == pytest.approx(want) and c["audit_tokens"] > 0
    assert all(c["mean_ttft_s"] > 0 and c["wall_s"] > 0 for c in configs.values())
    for c in (plain, full, configs["choreographed@auto"]):  # per workflow, per input
        assert c["workflows_over_baseline"]["of"] == 2
        assert 0 <= c["workflows_over_baseline"]["over"] <= 2
    assert "runs over baseline" in ev.output
    assert (tmp_path / "scores.png").stat().st_size > 0

    bad = _invoke("fidelity", "multi-qa", "--inputs", pairs, *common, "--repair", "some")
    assert bad.exit_code == 2 and "repair 'some'" in bad.output


def test_a_policy_label_is_plain_and_a_bare_one_has_the_defaults():
    """`choreographed@P` runs P on every call (`@none`: plain choreography, the decision
    steps' default off); a bare `choreographed` is the engine's defaults."""
    from corps.cli.eval_options import config_of as _config
    from corps.cli.eval_options import repairs_of as _repairs
    from corps.engine import DECISION_REPAIR

    assert _repairs("none, full") == ["choreographed@none", "choreographed@full"]
    plain = _config("smollm2-135m", "choreographed@none", "float32")
    assert (plain.repair, plain.decision_repair) == ("none", "none")
    bare = _config("smollm2-135m", "choreographed", "float32")
    assert (bare.repair, bare.decision_repair) == ("none", DECISION_REPAIR)
    full = _config("smollm2-135m", "choreographed@full", "float32")
    assert (full.repair, full.decision_repair) == ("full", "none")
    auto = _config("smollm2-135m", "choreographed@auto", "float32")  # decision steps start higher
    assert (auto.repair, auto.decision_repair) == ("auto", DECISION_REPAIR)
    # --decision-repair: the bare and @auto configurations' decision steps, no other
    cases = (("choreographed", "full"), ("choreographed@auto", "full"),
             ("choreographed@none", "none"), ("choreographed@first:4", "none"))  # fmt: skip
    for label, want in cases:
        assert _config("smollm2-135m", label, "float32", "full").decision_repair == want


def test_eval_takes_a_decision_repair_and_refuses_a_bad_one(tiny_dirs, tmp_path, pairs):
    bad = _invoke("eval", "multi-qa", "--inputs", pairs, "--model", tiny_dirs["llama"],
                  "--decision-repair", "query:9")  # fmt: skip
    assert bad.exit_code == 2 and "decision" in bad.output and "Traceback" not in bad.output
