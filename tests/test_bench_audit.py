"""`corps bench audit` (corps.bench.audit): the audit's gap beside corps fidelity's on
the same tokens, and its cost per rate, on a tiny model. Never asserts on time."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from corps.cli.app import app


def test_the_audit_and_fidelity_see_the_same_turns_and_a_chain_agrees(tiny_dirs, tmp_path):
    out = tmp_path / "a.json"
    result = CliRunner().invoke(app, [
        "bench", "audit", "tree-of-thoughts", "--model", str(tiny_dirs["llama"]), "--n", "2",
        "--set", "max_tokens=6", "--set", "branches=2", "--set", "voters=2", "--rates", "2",
        "--rounds", "1", "--budget", "1", "--json", str(out),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    rows = {r["role"]: r for r in report["agreement"]}
    assert set(rows) >= {"proposer", "voter", "all"}
    for r in rows.values():  # every sampled position was audited, and both gaps exist
        assert r["positions"] == r["audited_positions"] > 0
        assert math.isfinite(r["sampled_gap"]) and r["audit_gap"] >= -1e-6  # a KL, rounded
    assert rows["proposer"]["audit_gap"] == pytest.approx(0.0, abs=1e-4)  # they read a chain
    assert rows["proposer"]["audit_agree"] == 1.0
    off, two = report["cost"]
    assert off["audit"] == 0 and off["audit_tokens"] == 0 and off["audited"] == 0
    assert two["audit"] == 2 and two["audit_tokens"] > 0 and two["audited"] > 0
    assert off["paired"] == [1.0, 1.0, 1.0] and off["cpu_paired"] == [1.0, 1.0, 1.0]
    assert two["cpu_s"] > 0 and len(two["cpus"]) == len(two["walls"]) == 1
    assert "what the audit costs" in result.output


def test_the_uncapped_decision_repair_is_measured_when_asked(tiny_dirs):
    """`--no-repair-bound`: the decision steps' repair as the policy chooses it, said so."""
    result = CliRunner().invoke(app, [
        "bench", "audit", "tree-of-thoughts", "--model", str(tiny_dirs["llama"]), "--n", "1",
        "--set", "max_tokens=4", "--set", "branches=2", "--set", "voters=2", "--rates", "",
        "--decision-repair", "full", "--no-repair-bound",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "decision steps full, uncapped" in " ".join(result.output.split())


@pytest.mark.parametrize("rates", ["x", "0", "2,-1"])
def test_bad_rates_exit_before_anything_loads(rates):
    result = CliRunner().invoke(app, ["bench", "audit", "debate", "--rates", rates])
    assert result.exit_code != 0 and "--rates" in result.output


def test_paired_ratios_are_per_round():
    from corps.bench.audit import _paired

    assert _paired([2.0, 3.0, 12.0], [2.0, 2.0, 10.0]) == (1.2, 1.0, 1.5)
    assert all(math.isnan(x) for x in _paired([], []))


def test_the_warm_up_is_taken_out_per_agent_whatever_its_policies():
    """An agent with a row per policy (repair="auto" moved it): the audits between two
    reports are the sums after less the sums before, per agent."""
    from corps.bench.audit import _minus
    from corps.engine import AuditKey, AuditRow

    def row(repair, n, gap, agree):
        return AuditRow(AuditKey("tot", "voter", repair), 1, n, gap, agree, 0)

    before = [row("none", 8, 0.2, 0.5)]
    after = [row("none", 16, 0.15, 0.75), row("first:4", 8, 0.05, 1.0)]
    n, kl, agree = _minus(after, before)["voter"]
    assert n == 16
    assert kl == pytest.approx(16 * 0.15 + 8 * 0.05 - 8 * 0.2)
    assert agree == pytest.approx(16 * 0.75 + 8 * 1.0 - 8 * 0.5)
