"""The built-in patterns (corps.patterns) end to end, in both engine modes."""

from __future__ import annotations

import itertools

import anyio
import pytest

from corps.agents import Runtime
from corps.patterns import PATTERNS, BadParameters, UnknownPattern, run_pattern
from corps.patterns.branch_solve_merge import MERGE, SOLVE
from corps.patterns.registry import validate
from corps.patterns.samples import DOCUMENT_PARAGRAPHS

from conftest import open_tiny

MODES = ["choreographed", "baseline"]
SMALL = dict(max_tokens=6, seed=3)
SHORT_DOC = " ".join(DOCUMENT_PARAGRAPHS[:3])
SETTINGS = {
    "debate": dict(rounds=2),
    "parallel_debate": dict(agents=3, rounds=3),
    "tree_of_thoughts": dict(branches=4, voters=3),
    "branch_solve_merge": dict(concepts=["dog", "park", "rain", "kite"]),
    "map_reduce": dict(document=SHORT_DOC, chunk_tokens=128, fan_in=2),
    "multi_qa": dict(),
    "prisoners_dilemma": dict(leak_policy="allow"),
}


async def run(tiny_dirs, name: str, mode: str, engine_kw=None, **params):
    cfg = dict(mode=mode, **(engine_kw or {}))
    async with open_tiny(tiny_dirs, "llama", **cfg) as engine, Runtime(engine) as rt:
        result = await run_pattern(rt, name, {**SMALL, **SETTINGS[name], **params})
        assert engine.stats().messages == 0  # the run freed every encoding it made
        return result


def ids(handles) -> list[int]:
    return [h.id for h in handles]


@pytest.mark.parametrize("mode", MODES)
async def test_tree_of_thoughts_structure(tiny_dirs, mode):
    r = await run(tiny_dirs, "tree_of_thoughts", mode)
    m = r.messages
    propose, vote, finish, proposals = m[0], m[1], m[2], m[3:7]
    vote_now, ballots = m[7], m[8:11]
    finish_now, final = m[11], m[12]
    assert r.calls == 13 and r.mode == mode and r.pattern == "tree_of_thoughts"
    assert all(p.parents == (propose,) for p in proposals)
    assert vote_now.parents == (vote, *proposals)
    assert all(b.parents == (vote, *proposals, vote_now) for b in ballots)
    winner = r.details["winner"]
    best = proposals[winner - 1]
    assert 1 <= winner <= 4 and final.parents == (finish, best, finish_now)
    assert finish_now.parents == (finish, best)
    assert all(p.text.startswith(f"Solution #{i + 1}:") for i, p in enumerate(proposals))
    # random weights vote gibberish: every bad ballot is a parse error, not a crash
    assert len(r.details["votes"]) + sum("voter" in e for e in r.parse_errors) == 3
    if mode == "choreographed":  # proposals sit right after [propose], overlapping
        assert {p.offset for p in proposals} == {propose.offset + propose.length}


@pytest.mark.parametrize("mode", MODES)
async def test_parallel_debate_reads_the_others(tiny_dirs, mode):
    r = await run(tiny_dirs, "parallel_debate", mode)
    instr, update, rounds = r.messages[0], r.messages[1], r.messages[2:]
    assert r.calls == 2 + 9
    r1, r2, r3 = rounds[0:3], rounds[3:6], rounds[6:9]
    assert all(h.parents == (instr,) for h in r1)
    for k in range(3):
        others = [h for j, h in enumerate(r1) if j != k]
        assert r2[k].parents == (instr, r1[k], *others, update)
        others = [h for j, h in enumerate(r2) if j != k]
        assert r3[k].parents == (instr, r1[k], r2[k], *others, update)
    assert set(r.details) == {"answers", "counts", "consensus"}


async def test_parallel_debate_encodes_each_answer_once(tiny_dirs):
    chor = await run(tiny_dirs, "parallel_debate", "choreographed")
    base = await run(tiny_dirs, "parallel_debate", "baseline")
    # choreography: every message is encoded exactly once, by the call that made it,
    # except the last round's answers (final: no turn reads them), whose last token
    # and closing footer are not encoded at all
    last = chor.messages[-3:]
    kept = chor.messages[:-3]
    assert all(h.tokens_encoded == h.length for h in kept if h.generated)
    assert all(h.tokens_encoded < h.length for h in last)  # exact tail: test_final.py
    assert chor.tokens_encoded == sum(h.length for h in kept) + sum(h.tokens_encoded for h in last)
    # baseline: each reader re-encodes the other agents' previous answers
    answers = base.messages[2:]
    reread = sum(
        answers[3 * (r - 1) + j].length
        for r in (1, 2)
        for k in range(3)
        for j in range(3)
        if j != k
    )
    assert base.tokens_encoded >= sum(h.length for h in answers) + reread
    assert chor.tokens_encoded < base.tokens_encoded


@pytest.mark.parametrize("mode", MODES)
async def test_debate_structure(tiny_dirs, mode):
    r = await run(tiny_dirs, "debate", mode)
    aff, neg, mod = r.messages[:3]
    turns = [h for h in r.messages if h.text.startswith(("Affirmative", "Negative"))]
    verdicts = [h for h in r.messages if h.text.startswith('{"Reasoning"')]
    assert len(verdicts) == r.details["rounds_run"] >= 1
    for i, t in enumerate(turns):
        own = aff if t.text.startswith("Affirmative") else neg
        assert t.parents == (own, *turns[:i])  # its instructions + every turn so far
    for r_i, v in enumerate(verdicts):
        assert v.parents == (mod, *verdicts[:r_i], *turns[2 * r_i : 2 * r_i + 2])
    if not r.details["early_stop"]:
        judge, final = r.messages[-2:]
        assert final.parents == (mod, *turns, judge)
    assert r.answer is not None


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", ["serial", "parallel"])
async def test_branch_solve_merge_layouts(tiny_dirs, mode, layout):
    r = await run(tiny_dirs, "branch_solve_merge", mode, layout=layout)
    branch, solve, merge = r.messages[:3]  # the instructions, first, in one step
    assert [h.text for h in (branch, solve, merge)][1:] == [SOLVE, MERGE]
    stories, final = r.messages[-3:-1], r.messages[-1]
    assert final.parents == (merge, *stories)
    assert all(h.parents[0] == solve for h in stories)
    groups = r.details["groups"]
    assert sorted(groups[0] + groups[1]) == sorted(SETTINGS["branch_solve_merge"]["concepts"])
    assert 0.0 <= r.details["coverage"] <= 1.0
    if mode == "choreographed":
        msg = final.table.get(final.id)
        at = merge.offset + merge.length
        want = (at, at) if layout == "parallel" else (at, at + stories[0].length)
        assert msg.parent_offsets[1:] == want


@pytest.mark.parametrize("mode", MODES)
async def test_map_reduce_fans_in_to_one(tiny_dirs, mode):
    r = await run(tiny_dirs, "map_reduce", mode)
    levels = r.details["levels"]
    assert levels[0] == r.details["chunks"] > 2 and levels[-1] == 1
    assert all(b == (a + 1) // 2 for a, b in itertools.pairwise(levels))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", ["serial", "parallel"])
async def test_multi_qa_questions_are_independent(tiny_dirs, mode, layout):
    r = await run(tiny_dirs, "multi_qa", mode, layout=layout)
    system, q1, q2, reply = r.messages
    assert q1.parents == (system,) and q2.parents == (system,)  # never each other
    assert reply.parents == (system, q1, q2)
    if mode == "choreographed":
        want = q1.offset if layout == "parallel" else q1.offset + q1.length
        assert q2.offset == want
    assert len(r.details["answered"]) == 2


CONSTRAINED = sorted(set(SETTINGS) - {"map_reduce"})  # map-reduce's summaries are free text


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", CONSTRAINED)
@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_constrained_outputs_always_parse(tiny_dirs, name, mode, seed):
    """A random model writes noise, yet every output a pattern parses has its form:
    votes, verdicts, decisions, numbered answers, boxed answers, the split."""
    r = await run(tiny_dirs, name, mode, seed=seed)
    assert r.parse_errors == []
    if name == "branch_solve_merge":
        one, two = r.details["groups"]
        assert one and two and sorted(one + two) == sorted(SETTINGS[name]["concepts"])
    free = await run(tiny_dirs, name, mode, seed=seed, constrained=False)
    if name in ("debate", "tree_of_thoughts", "prisoners_dilemma"):
        assert free.parse_errors  # noise does not parse: the constraint is what helps


@pytest.mark.parametrize("name", sorted(SETTINGS))
async def test_choreography_encodes_no_more_than_baseline(tiny_dirs, name):
    """The same work in both modes (free decodes: a random model never stops early, so
    both run every turn to max_tokens), of which choreography encodes less (plain
    choreography: no repair of the decision steps either)."""
    free = {} if name == "map_reduce" else dict(constrained=False)
    plain = dict(decision_repair="none")
    chor = await run(tiny_dirs, name, "choreographed", engine_kw=plain, **free)
    base = await run(tiny_dirs, name, "baseline", **free)
    assert chor.calls == base.calls  # the same structure in both modes
    if name == "multi_qa":  # one reader: nothing to reuse, the same work either way,
        # but the baseline never encodes its answer's last token and footer (3 tokens)
        assert chor.tokens_encoded <= base.tokens_encoded + 2 + 3
    else:
        assert chor.tokens_encoded < base.tokens_encoded


async def test_seeded_runs_are_reproducible_and_share_a_runtime(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine, Runtime(engine) as rt:
        params = {**SMALL, **SETTINGS["tree_of_thoughts"], "temperature": 1.0}
        results = [None] * 3

        async def one(i: int) -> None:
            results[i] = await run_pattern(rt, "tree-of-thoughts", params)

        async with anyio.create_task_group() as tg:  # three runs at once, one runtime
            for i in range(3):
                tg.start_soon(one, i)
        texts = [[h.text for h in r.messages] for r in results]
        assert texts[0] == texts[1] == texts[2]
        assert engine.stats().mean_batch_size > 1


def test_bad_parameters_say_what_is_valid():
    with pytest.raises(UnknownPattern, match="tree-of-thoughts"):
        from corps.patterns.registry import get

        get("tree-of-thought")
    with pytest.raises(BadParameters, match=r"unknown parameter 'branchez'.*branches"):
        validate(PATTERNS["tree_of_thoughts"], {"branchez": 3})
    with pytest.raises(BadParameters, match="branches"):
        validate(PATTERNS["tree_of_thoughts"], {"branches": "many"})
    assert validate(PATTERNS["tree_of_thoughts"], {"branches": "16"})["branches"] == 16


@pytest.mark.filterwarnings("ignore::corps.cache.visibility.LeakWarning")
async def test_prisoners_dilemma_counts_its_leaks(tiny_dirs):
    r = await run(tiny_dirs, "prisoners_dilemma", "choreographed", leak_policy="warn")
    assert r.leaks == 12 and set(r.details["decisions"]) == {"Alice", "Bob"}
    r = await run(tiny_dirs, "prisoners_dilemma", "choreographed", leak_policy="reencode")
    assert r.leaks == 0


@pytest.mark.real_model
@pytest.mark.filterwarnings("ignore::corps.cache.visibility.LeakWarning")
async def test_real_model_smoke_every_pattern(real_dir):
    from corps.engine import Engine

    async with Engine.open(str(real_dir), capacity=16384) as engine, Runtime(engine) as rt:
        for name in sorted(PATTERNS):
            r = await run_pattern(rt, name, dict(max_tokens=16, seed=0))
            assert r.calls > 0 and r.tokens_encoded > 0 and r.wall_s > 0, name
            assert r.answer is None or isinstance(r.answer, str)
            assert r.parse_errors == [], (name, r.parse_errors)  # constrained outputs parse
        assert engine.stats().messages == 0


DECIDERS = {"tree_of_thoughts": "voter", "debate": "moderator", "map_reduce": "reduce",
            "branch_solve_merge": "merge"}  # fmt: skip


@pytest.mark.parametrize("name", sorted(DECIDERS))
@pytest.mark.parametrize(
    "engine_kw", [{}, dict(decision_repair="none"), dict(decision_repair="full")]
)
async def test_decision_steps_get_the_decision_repair_where_nothing_names_one(
    tiny_dirs, name, engine_kw
):
    """A pattern's decision step (voters, the moderator and judge, the reducer, the
    merger) runs under the engine's `decision_repair` where neither the engine nor
    the workflow names a repair; the other agents are not repaired by it. A tree of
    thoughts' voters read one set of proposals: one of them recomputes, the others
    read its repaired context."""
    async with open_tiny(tiny_dirs, "llama", **engine_kw) as engine, Runtime(engine) as rt:
        r = await run_pattern(rt, name, {**SMALL, **SETTINGS[name]})
        repaired = engine.stats().tokens_repaired
    role = DECIDERS[name]
    deciders = [h for h in r.messages if (h.owner or "").endswith(f"-{role}")]
    others = [h for h in r.messages if h.owner and h not in deciders]
    assert deciders and others
    assert all(h.tokens_repaired == 0 for h in others)
    if engine_kw.get("decision_repair") == "none":
        assert repaired == 0
    else:
        assert repaired == sum(h.tokens_repaired for h in deciders) > 0
    if name == "tree_of_thoughts" and repaired:
        assert sum(h.tokens_repaired > 0 for h in deciders) == 1  # one repair, shared
        # ... read by the others: none built a context of its own for the bound to cut
        assert all(h.tokens_repair_cut == 0 for h in deciders if not h.tokens_repaired)


async def test_a_named_repair_reaches_every_call_instead(tiny_dirs):
    """With the engine's `repair` named, the decision steps take it like every call:
    `decision_repair` changes nothing then."""
    got = []
    for decision in ("none", "full"):
        cfg = dict(repair="first:1", decision_repair=decision)
        async with open_tiny(tiny_dirs, "llama", **cfg) as engine, Runtime(engine) as rt:
            params = {**SMALL, **SETTINGS["tree_of_thoughts"]}
            r = await run_pattern(rt, "tree_of_thoughts", params)
        got.append([h.tokens_repaired for h in r.messages if (h.owner or "").endswith("-voter")])
    assert got[0] == got[1] and sum(got[0]) > 0


@pytest.mark.parametrize(("decision", "voters_repaired"), [("query:0.3", True), ("none", False)])
async def test_under_auto_the_decision_steps_start_at_their_repair(
    tiny_dirs, decision, voters_repaired
):
    """With repair="auto", a tree of thoughts' voters start auto's ladder at the
    decision repair's rung ("auto:query:0.3"), the other agents at none; with the
    decision default off, every key starts at none."""
    cfg = dict(repair="auto", decision_repair=decision, audit_budget=0.001)
    async with open_tiny(tiny_dirs, "llama", **cfg) as engine, Runtime(engine) as rt:
        params = {**SMALL, **SETTINGS["tree_of_thoughts"]}
        r = await run_pattern(rt, "tree_of_thoughts", params)
        report = await engine.fidelity_report()
    voters = [h for h in r.messages if (h.owner or "").endswith("-voter")]
    proposers = [h for h in r.messages if (h.owner or "").endswith("-proposer")]
    assert (sum(h.tokens_repaired for h in voters) > 0) == voters_repaired
    assert all(h.tokens_repaired == 0 for h in proposers)
    if voters_repaired:
        assert report.auto[("tree_of_thoughts", "voter")] == "query:0.3"
