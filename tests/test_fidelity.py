"""Fidelity on equal tokens (corps.patterns.evaluation.fidelity)."""

from __future__ import annotations

import math

import pytest

from corps.agents import Runtime
from corps.patterns.evaluation import fidelity
from corps.patterns.replay import TurnScores

from conftest import open_tiny

CHAIN = dict(questions=["what is two plus two"], answers=None, max_tokens=6, constrained=False)
BLOCKED = dict(questions=["what is two plus two", "name a colour"], answers=None,
               layout="parallel", max_tokens=6, constrained=False)  # fmt: skip


async def _measure(tiny_dirs, lines, stats=None, **kw):
    async with (
        open_tiny(tiny_dirs, "llama", mode="baseline") as b,
        open_tiny(tiny_dirs, "llama") as c,
        Runtime(b) as rb,
        Runtime(c) as rc,
    ):
        report = await fidelity.measure(
            rb, {"choreographed": rc}, "multi_qa", lines, list(range(len(lines))), **kw
        )
        if stats is not None:
            stats["choreographed"] = c.stats()
        return report


async def test_a_chain_workflow_has_no_gap(tiny_dirs):
    """One question after the system prompt: choreography reads exactly what the
    baseline re-encodes, so in float32 the two modes score every token alike."""
    report = await _measure(tiny_dirs, [CHAIN] * 3)
    (answerer, total) = report.tables()["choreographed"]
    assert answerer.role == "answerer" and total.role == "all"
    assert total.turns == 3 and total.tokens > 0 and not report.failed
    assert abs(total.gap) < 1e-4 and total.agreement == 1.0
    assert total.diverged == 0 and total.first_divergence is None


async def test_overlapping_questions_open_a_gap(tiny_dirs):
    """Two questions that never saw each other (blockage): the replay scores the
    baseline's tokens differently, and the report says where they first diverge."""
    done, stats = [], {}
    report = await _measure(tiny_dirs, [BLOCKED] * 3, stats, on_done=lambda: done.append(1))
    total = report.tables()["choreographed"][-1]
    assert len(done) == 6 and total.turns == 3  # each input sampled, then replayed
    forced = sum(len(t.tokens) for p in report.pairs["choreographed"] for t in p.baseline.values())
    first = sum(len(t.tokens) for t in report.pairs["choreographed"][0].baseline.values())
    assert stats["choreographed"].tokens_sampled == forced + first  # input 0 once more, untimed
    assert abs(total.gap) > 1e-3 and total.agreement < 1.0
    assert report.as_dict()["replays"]["choreographed"][-1]["gap"] == total.gap


async def test_a_full_repair_reads_what_the_baseline_reads(tiny_dirs):
    """Replayed with every rewired token recomputed in its reader's context, the
    blocked workflow (serial: each question where the baseline reads it) scores the
    baseline's tokens as the baseline does (float32);
    the report says what each replay recomputed and how long it took."""
    async with (
        open_tiny(tiny_dirs, "llama", mode="baseline") as b,
        open_tiny(tiny_dirs, "llama") as c,
        open_tiny(tiny_dirs, "llama", repair="full", repair_bound=False) as f,
        Runtime(b) as rb,
        Runtime(c) as rc,
        Runtime(f) as rf,
    ):
        replays = {"choreographed": rc, "choreographed@full": rf}
        serial = {**BLOCKED, "layout": "serial"}  # q2 after q1, encoded without it
        report = await fidelity.measure(rb, replays, "multi_qa", [serial] * 2, [0, 1])
    plain, full = (report.tables()[k][-1] for k in replays)
    assert abs(plain.gap) > 1e-3 and abs(full.gap) < 1e-4 and full.agreement == 1.0
    assert plain.recomputed == 0.0 and 0.0 < full.recomputed < 1.0
    assert full.ttft is not None and set(report.wall) == {"baseline", *replays}
    assert full.baseline_ttft is not None and full.baseline_ttft == plain.baseline_ttft


async def test_serial_full_repairs_questions_read_at_one_offset(tiny_dirs):
    """Parallel multi-QA: recomputing the second question where it overlaps the first
    leaves a gap; laid end to end first ("serial+full"), the replay reads what the
    baseline reads (float32)."""
    async with (
        open_tiny(tiny_dirs, "llama", mode="baseline") as b,
        open_tiny(tiny_dirs, "llama", repair="full", repair_bound=False) as f,
        open_tiny(tiny_dirs, "llama", repair="serial+full", repair_bound=False) as s,
        Runtime(b) as rb,
        Runtime(f) as rf,
        Runtime(s) as rs,
    ):
        replays = {"choreographed@full": rf, "choreographed@serial+full": rs}
        report = await fidelity.measure(rb, replays, "multi_qa", [BLOCKED] * 2, [0, 1])
    full, serial = (report.tables()[k][-1] for k in replays)
    assert abs(full.gap) > 1e-3 and abs(serial.gap) < 1e-4 and serial.agreement == 1.0
    assert serial.recomputed == full.recomputed > 0.0  # the second question, entire


async def test_a_failing_input_is_reported_and_the_others_measured(tiny_dirs):
    bad = {**CHAIN, "max_tokens": 100_000}  # beyond the tiny model's positions
    report = await _measure(tiny_dirs, [CHAIN, bad, CHAIN])
    assert [i for i, _ in report.failed] == [1]
    assert [p.index for p in report.pairs["choreographed"]] == [0, 2]


def test_rows_by_hand():
    base = TurnScores("a", (1, 2, 3), (-1.0, -2.0, -3.0), (1, 2, 3))
    other = TurnScores("a", (1, 2, 3), (-2.0, -2.0, -5.0), (1, 9, 3))
    row = fidelity.Row("a")
    row.add(base, other)
    row.add(base, base)
    assert row.tokens == 6 and row.baseline_loss == pytest.approx(2.0)
    assert row.replay_loss == pytest.approx((9 + 6) / 6) and row.gap == pytest.approx(0.5)
    assert row.agreement == pytest.approx(5 / 6) and row.diverged == 1
    assert row.first_divergence == 1


def test_the_share_of_the_baselines_own_work_by_hand():
    """A repair's cost against the context tokens the baseline encoded for the same
    turns (encoded less generated): 1.0 saves nothing."""
    base = TurnScores("a", (1, 2), (-1.0, -1.0), (1, 2), encoded=12)  # 10 context tokens
    other = TurnScores("a", (1, 2), (-1.0, -1.0), (1, 2), repaired=5, encoded=9)
    row = fidelity.Row("a")
    row.add(base, other)
    row.add(base, other)
    assert row.base_work == 20 and row.of_baseline == pytest.approx(0.5)
    assert math.isnan(fidelity.Row("b").of_baseline)


def test_calls_and_workflows_over_the_baselines_work_by_hand():
    """Per call: a turn whose recompute exceeds the baseline's context work for it;
    per workflow: a replay that encoded more tokens in all than the baseline's."""
    base = TurnScores("a", (1,), (-1.0,), (1,), encoded=11)  # 10 context tokens
    cheap = TurnScores("a", (1,), (-1.0,), (1,), repaired=4, encoded=6)
    dear = TurnScores("a", (1,), (-1.0,), (1,), repaired=15, encoded=17)
    cached = TurnScores("a", (1,), (-1.0,), (1,), encoded=1)  # the baseline had it all
    row = fidelity.Row("a")
    row.add(base, cheap)
    row.add(base, dear)
    row.add(cached, cheap)  # any recompute beats a baseline that encoded no context
    assert row.calls_over == 2 and math.isinf(row.worst_call)
    assert row.as_dict()["worst_call_of_baseline_work"] is None  # JSON has no infinity
    row = fidelity.Row("a")
    row.add(base, cheap)
    assert row.calls_over == 0 and row.worst_call == pytest.approx(0.4)
    pairs = [fidelity.Pair(0, {}, {}, 100, 80), fidelity.Pair(1, {}, {}, 50, 60)]
    report = fidelity.Report("p", {"choreographed": pairs})
    assert report.work("choreographed") == (pytest.approx(140 / 150), 1)
    assert pairs[1].of_baseline == pytest.approx(1.2)
    assert report.as_dict()["workflows"]["choreographed"][1] == dict(
        index=1, baseline_encoded=50, replay_encoded=60
    )


def test_sampling_params_keep_the_pattern_inputs_only():
    line = {"questions": ["a"], "answers": ["b"], "id": "x", "answer": "7"}
    got = fidelity.sampling_params("multi_qa", line, 5)
    assert got == dict(questions=["a"], answers=["b"], seed=5, temperature=1.0, top_p=1.0,
                       constrained=False)  # fmt: skip
    assert fidelity.sampling_params("multi_qa", {"constrained": True}, 1)["constrained"]
