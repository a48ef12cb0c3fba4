"""engine/api/audit.py: the online fidelity audit compares a choreographed call with the
baseline's encoding of the same text, changes nothing the call returns, leaves the
store as it was, and settles repair="auto" per workflow and agent."""

from __future__ import annotations

import json

import pytest
import torch

from corps.agents import Agent, Runtime
from corps.engine.api import audit as audit_mod
from corps.engine.audit import AUDIT_POSITIONS
from corps.engine.errors import InvalidRequest

import conftest

TEXTS = ("You are a careful solver.", "What is seven times six?", "Name a prime above ten.")


def open_tiny(tiny_dirs, name: str = "llama", **kwargs):
    """A tiny engine whose repairs are not capped by the baseline's work: these tests
    measure what a policy recomputes (the bound: tests/test_baseline_work.py)."""
    return conftest.open_tiny(tiny_dirs, name, **{"repair_bound": False, **kwargs})


async def parallel(engine):
    """A system prompt and two questions encoded apart on it (the second over the first)."""
    sys = await engine.prefill(TEXTS[0], role="system")
    q1 = await engine.prefill(TEXTS[1], parents=[sys])
    q2 = await engine.prefill(TEXTS[2], parents=[sys], offsets=[0])
    return sys, q1, q2


def spy(monkeypatch) -> list:
    """Every comparison the auditor makes: (kept rows, shadow rows, header length)."""
    seen = []
    real = audit_mod._gap

    def record(kept, rows, header):
        seen.append((kept, rows, header))
        return real(kept, rows, header)

    monkeypatch.setattr(audit_mod, "_gap", record)
    return seen


async def test_a_chain_audits_to_no_gap_and_a_rewired_context_to_some(tiny_dirs):
    """A chain reads exactly what the baseline reads: gap 0, full agreement. Two
    questions encoded apart do not; `serial+full` (the baseline's reading) closes it."""
    async with open_tiny(tiny_dirs, "llama", audit=1, audit_budget=1.0) as engine:
        sys, q1, q2 = await parallel(engine)
        kw = dict(max_tokens=AUDIT_POSITIONS + 2, ignore_eos=True)
        with engine.workflow("chain"):
            await engine.decode(parents=[sys, q1], **kw)
        with engine.workflow("apart"):
            await engine.decode(parents=[sys, q1, q2], **kw)
        with engine.workflow("repaired"):
            await engine.decode(parents=[sys, q1, q2], repair="serial+full", **kw)
        report = await engine.fidelity_report()
        rows = {r.key.workflow: r for r in report.rows}
        assert rows["chain"].gap == pytest.approx(0.0, abs=1e-5)
        assert rows["chain"].agreement == 1.0 and rows["chain"].positions == AUDIT_POSITIONS
        assert rows["apart"].gap > 1e-3
        assert rows["repaired"].gap == pytest.approx(0.0, abs=1e-5)
        assert rows["repaired"].key.repair == "serial+full"
        assert report.total.calls == 3 and report.failed == 0
        engine.check()


async def test_the_shadow_is_the_baseline_and_the_kept_rows_are_the_calls_own(
    tiny_dirs, tiny_hf, monkeypatch
):
    """The shadow's rows are transformers' logits over the baseline's prompt (sink,
    parents' tokens, header, generated); the kept rows are the distributions the call
    drew from (their value at each token is its logprob, their argmax its greedy)."""
    seen = spy(monkeypatch)
    async with open_tiny(tiny_dirs, "llama", audit=1, audit_budget=1.0) as engine:
        sys, q1, q2 = await parallel(engine)
        h = await engine.decode(parents=[sys, q1, q2], max_tokens=5, ignore_eos=True,
                                logprobs=True)  # fmt: skip
        await engine.fidelity_report()
        fmt = engine.chat
    ((kept, rows, header),) = seen
    head = fmt.encode(fmt.frame("assistant")[0])
    prompt = list(fmt.sink) + sys.tokens + q1.tokens + q2.tokens + head + h.generated[:4]
    with torch.no_grad():
        want = tiny_hf["llama"](torch.tensor([prompt])).logits[0, -len(head) - 4 :]  # (own, V)
    torch.testing.assert_close(rows, want, atol=1e-4, rtol=1e-4)
    assert header == len(head) and [p for p, _ in kept] == [0, 1, 2, 3, 4]
    for (_, row), tok, lp, g in zip(kept, h.generated, h.logprobs, h.greedy, strict=True):
        assert float(row[tok]) == pytest.approx(lp, abs=1e-6) and int(row.argmax()) == g


async def test_an_audit_changes_nothing_the_call_returns_nor_the_store(tiny_dirs):
    kw = dict(max_tokens=6, ignore_eos=True)
    results = {}
    for audit in (0, 1):
        async with open_tiny(tiny_dirs, "llama", audit=audit, audit_budget=1.0) as engine:
            sys, q1, q2 = await parallel(engine)
            greedy = await engine.decode(parents=[sys, q1, q2], **kw)
            sampled = await engine.decode(parents=[sys, q1, q2], temperature=1.0, seed=3, **kw)
            await engine.fidelity_report()
            stats = engine.stats()
            results[audit] = (greedy.generated, sampled.generated, stats.messages,
                              stats.tokens_used, stats.audited)  # fmt: skip
            engine.check()
    assert results[1][:4] == results[0][:4]
    assert results[0][4] == 0 and results[1][4] == 2


async def test_one_in_n_per_workflow_and_agent_and_the_nearest_rate_wins(tiny_dirs):
    class Voter(Agent):
        audit = 0  # never, whatever the workflow says

        async def handle(self, msg):
            return await self.decode(parents=[msg], max_tokens=2, ignore_eos=True)

    async with (
        open_tiny(tiny_dirs, "llama", audit=3, audit_budget=1.0) as engine,
        Runtime(engine) as rt,
    ):
        sys, q1, _ = await parallel(engine)
        kw = dict(parents=[sys, q1], max_tokens=2, ignore_eos=True)
        for _ in range(7):
            await engine.decode(**kw)  # the 1st, 4th and 7th
        await engine.decode(**kw, audit=0)  # the call's own rate: not audited
        with engine.workflow("every", audit=1):
            await engine.decode(**kw)
            await engine.decode(**kw)
            await rt.spawn(Voter, "voter")
            await rt.ask("voter", q1)
        await engine.prefill("a prefill is never audited", parents=[sys])
        await engine.decode(max_tokens=2, ignore_eos=True)  # no parents: nothing reused
        report = await engine.fidelity_report()
    calls = {r.key.workflow: r.calls for r in report.rows}
    assert calls == {"": 3, "every": 2}


async def test_a_parent_freed_after_the_call_is_still_there_for_its_shadow(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama", audit=1, audit_budget=1.0) as engine:
        sys, q1, q2 = await parallel(engine)
        await engine.decode(parents=[sys, q1, q2], max_tokens=3, ignore_eos=True)
        engine.free(q2)  # before its shadow ran
        report = await engine.fidelity_report()
        assert report.total.calls == 1 and report.failed == 0
        engine.check()  # q2's slots went back once the shadow let go of it


async def test_check_while_a_shadow_is_pending_says_so_and_the_books_are_exact_after(tiny_dirs):
    # found by the fuzz: check() right after an audited call returned took the shadow's
    # pins on its parents for a broken invariant
    async with open_tiny(tiny_dirs, "llama", audit=1, audit_budget=1.0) as engine:
        sys, q1, q2 = await parallel(engine)
        await engine.decode(parents=[sys, q1, q2], max_tokens=3, ignore_eos=True)
        with pytest.raises(InvalidRequest, match="fidelity_report"):
            engine.check()  # the shadow has not run yet: it still holds the parents
        await engine.fidelity_report()
        engine.check()


async def test_closing_with_shadows_pending_neither_hangs_nor_fails(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama", audit=1, audit_budget=1.0) as engine:
        sys, q1, q2 = await parallel(engine)
        h = await engine.decode(parents=[sys, q1, q2], max_tokens=3, ignore_eos=True)
    assert len(h.generated) == 3  # the engine closed with the shadow queued or running


async def test_audits_are_traced_without_text_and_counted_in_stats(tiny_dirs, tmp_path):
    path = tmp_path / "t.jsonl"
    async with open_tiny(tiny_dirs, "llama", audit=1, audit_budget=1.0, trace=path) as engine:
        sys, q1, q2 = await parallel(engine)
        h = await engine.decode(parents=[sys, q1, q2], max_tokens=3, ignore_eos=True,
                                owner="solver")  # fmt: skip
        await engine.fidelity_report()
        stats = engine.stats()
    events = [json.loads(line) for line in path.read_text().splitlines()]
    (audited,) = [e for e in events if e["type"] == "audited"]
    assert audited["agent"] == "solver" and audited["positions"] == 3
    assert audited["call"] != audited["shadow"] and audited["tokens"] > 0
    assert stats.audited == 1 and stats.audit_tokens == audited["tokens"]
    assert stats.audit_gap == pytest.approx(audited["gap"])
    assert TEXTS[2] not in json.dumps(audited) and h.text not in json.dumps(audited)


async def test_nothing_is_audited_in_the_baseline(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama", audit=1, mode="baseline") as engine:
        sys, q1, q2 = await parallel(engine)
        await engine.decode(parents=[sys, q1, q2], max_tokens=2, ignore_eos=True)
        assert (await engine.fidelity_report()).total.calls == 0


@pytest.mark.parametrize("bad", [-1, "3", True, 1.5, 10**9])
async def test_bad_audit_rates_are_refused_before_anything_runs(tiny_dirs, bad):
    async with open_tiny(tiny_dirs, "llama") as engine:
        sys = await engine.prefill(TEXTS[0], role="system")
        before = engine.stats()
        with pytest.raises(InvalidRequest, match="audit"):
            await engine.decode(parents=[sys], max_tokens=2, audit=bad)
        with pytest.raises(InvalidRequest, match="audit"):
            engine.workflow("w", audit=bad).__enter__()
        assert engine.stats().tokens_used == before.tokens_used
    with pytest.raises(InvalidRequest, match="audit"):
        open_tiny(tiny_dirs, "llama", audit=bad)


async def test_auto_moves_a_drifting_agent_up_the_ladder_and_says_why(
    tiny_dirs, tmp_path, monkeypatch
):
    """With the threshold below the tiny model's gap, the first audit moves the key up
    one rung: its next call runs with `first:4` (and repairs), a switch is traced."""
    import corps.engine.auto_repair as auto

    monkeypatch.setattr(auto, "HIGH", 1e-6)
    path = tmp_path / "t.jsonl"
    async with open_tiny(tiny_dirs, "llama", repair="auto", audit_budget=1.0, trace=path) as engine:
        sys, q1, q2 = await parallel(engine)
        kw = dict(parents=[sys, q1, q2], max_tokens=3, ignore_eos=True, owner="judge", audit=1)
        first = await engine.decode(**kw)
        report = await engine.fidelity_report()
        second = await engine.decode(**kw)
        await engine.fidelity_report()
        assert engine.stats().repair == "auto"
    assert first.tokens_repaired == 0 and second.tokens_repaired > 0
    assert report.auto == {("", "judge"): "first:4"}
    events = [json.loads(line) for line in path.read_text().splitlines()]
    switches = [e for e in events if e["type"] == "repair_switch"]
    assert switches[0]["before"] == "none" and switches[0]["after"] == "first:4"
    assert switches[0]["why"] == "high" and switches[0]["agent"] == "judge"
    audits = [e for e in events if e["type"] == "audited"]
    assert [a["repair"] for a in audits] == ["none", "first:4"]


async def test_a_due_audit_waits_for_the_budget_and_goes_to_the_next_call_it_allows(tiny_dirs):
    """With a budget of half the engine's other work, a due audit that would pass it is
    not dropped: the key's next call that fits takes it; the shadows never encode more
    than the budget allows."""
    async with open_tiny(tiny_dirs, "llama", audit=1, audit_budget=0.5) as engine:
        sys, q1, q2 = await parallel(engine)
        kw = dict(parents=[sys, q1, q2], max_tokens=4, ignore_eos=True)
        audited = []
        for _ in range(12):
            await engine.decode(**kw)
            await (
                engine.fidelity_report()
            )  # one at a time: each audit's cost is known before the next
            audited.append(engine.stats().audited)
        s = engine.stats()
    assert 0 < audited[-1] < 12  # some ran, some waited
    assert s.audit_tokens <= 0.5 * (s.tokens_encoded - s.audit_tokens)


async def test_a_quiet_stretch_saves_up_one_burst_at_most(tiny_dirs, monkeypatch):
    """Budget left unused while nothing was audited does not pile up: after a long
    unaudited stretch, the audits that follow take at most their budget of the work
    since plus one burst (the bucket's size)."""
    monkeypatch.setattr(audit_mod, "AUDIT_BURST", 40)
    async with open_tiny(tiny_dirs, "llama", audit_budget=0.5) as engine:
        sys, q1, q2 = await parallel(engine)
        kw = dict(parents=[sys, q1, q2], max_tokens=4, ignore_eos=True)
        with engine.workflow("quiet", audit=0):
            for _ in range(20):
                await engine.decode(**kw)
        before = engine.stats()
        with engine.workflow("audited", audit=1):
            for _ in range(6):
                await engine.decode(**kw)
                await engine.fidelity_report()
        after = engine.stats()
    spent = after.audit_tokens - before.audit_tokens
    work = (after.tokens_encoded - after.audit_tokens) - (
        before.tokens_encoded - before.audit_tokens
    )
    bound = sum(len(h.tokens) for h in (sys, q1, q2)) + AUDIT_POSITIONS
    assert 0 < spent <= 0.5 * work + max(40, bound)


async def test_runs_of_one_family_share_what_auto_learned(tiny_dirs, monkeypatch):
    """Two workflows of one family (a pattern's runs): what the first's audits taught
    `repair="auto"` applies to the second's calls; another family starts afresh."""
    import corps.engine.auto_repair as auto

    monkeypatch.setattr(auto, "HIGH", 1e-6)
    async with open_tiny(tiny_dirs, "llama", audit_budget=1.0) as engine:
        sys, q1, q2 = await parallel(engine)
        kw = dict(parents=[sys, q1, q2], max_tokens=3, ignore_eos=True, audit=1)
        with engine.workflow("run-1", repair="auto", family="qa"):
            assert (await engine.decode(**kw)).tokens_repaired == 0
            await engine.fidelity_report()
        with engine.workflow("run-2", repair="auto", family="qa"):
            assert (await engine.decode(**kw)).tokens_repaired > 0  # first:4 now
        with engine.workflow("other", repair="auto"):
            assert (await engine.decode(**kw)).tokens_repaired == 0
        report = await engine.fidelity_report()
    assert {r.key.workflow for r in report.rows} == {"qa", "other"}


@pytest.mark.parametrize("bad", [0, -0.1, 1.5, "half", None])
def test_a_bad_audit_budget_is_refused_before_anything_loads(tiny_dirs, bad):
    with pytest.raises(InvalidRequest, match="audit_budget"):
        open_tiny(tiny_dirs, "llama", audit_budget=bad)
