"""The trace viewer (corps.view): every pattern's trace renders, at any width."""

from __future__ import annotations

import io
import itertools

import pytest
from rich.console import Console

from corps import view as tv
from corps.engine.trace.reader import Trace

from conftest import TRACE_SETTINGS

KEYS = [*TRACE_SETTINGS, "debate@baseline"]


def render(*parts, width: int) -> str:
    console = Console(record=True, width=width, file=io.StringIO())
    for part in parts:
        console.print(part)
    text = console.export_text()
    assert all(len(line) <= width for line in text.splitlines())
    return text


@pytest.mark.parametrize("width", [80, 200])
@pytest.mark.parametrize("key", KEYS)
def test_every_pattern_renders_at_any_width(traces, key, width):
    trace = Trace.load(traces[key])
    text = render(*tv.overview(trace), width=width)
    for title in ("totals", "timeline", "KV lineage", "message graph", "leaks and errors"):
        assert title in text
    for c in list(trace.calls)[:3]:
        render(tv.call_detail(trace, c), width=width)


def test_leaks_are_shown_with_their_path(traces):
    trace = Trace.load(traces["prisoners_dilemma"])
    assert trace.leaks
    text = render(tv.problems(trace), width=200)
    assert "leak (warn)" in text and "via m" in text
    lk = trace.leaks[0]
    src = lk.sources[0]
    path = tv.leak_path(trace, lk.parent, src)
    assert path[0] == lk.parent and path[-1] == src
    for child, parent in itertools.pairwise(path):
        assert parent in trace.messages[child].parents  # each hop is a real parent edge


def test_errors_are_shown(traces, tmp_path):
    src = traces["debate"].read_text().splitlines()
    # turn the first decode's end into a failure and drop the closing line
    out = []
    for line in src:
        if (
            '"type":"end"' in line
            and '"kind":"decode"' in line
            and not any('"status":"error"' in x for x in out)
        ):
            line = line.replace('"status":"ok","error":null', '"status":"error","error":"boom"')
        if '"type":"closed"' not in line:
            out.append(line)
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(out) + "\n")
    trace = Trace.load(path)
    text = render(*tv.overview(trace), width=120)
    assert "error: call" in text and "boom" in text
    assert "not closed" in text


def test_totals_add_up(traces):
    trace = Trace.load(traces["tree_of_thoughts"])
    ends = [c.end for c in trace.calls.values()]
    text = render(tv.totals(trace), width=200)
    all_row = next(line for line in text.splitlines() if line.strip().startswith("all"))
    cells = all_row.split()
    assert cells[1] == str(len(ends))
    assert cells[2] == str(sum(e.encoded for e in ends))
    assert cells[3] == str(sum(e.reused for e in ends))


def test_critical_path_follows_what_each_call_waited_for(traces):
    """Each step back is a call whose message the later one read, or a call that
    ended before the later one was submitted; the voters a tree-of-thoughts run
    tallies before its solver are on it even though the solver does not read them."""
    trace = Trace.load(traces["tree_of_thoughts"])
    path = tv.critical_path(trace, tv.calls(trace))
    last = max(trace.calls.values(), key=lambda c: c.end.t)
    assert path[-1] is last and not path[0].queued.parents  # back to a root
    for earlier, later in itertools.pairwise(path):
        assert tv.reads(trace, later, earlier) or earlier.end.t <= later.start
    assert {"proposer", "voter", "solver"} <= {tv.names_of(trace)(c.agent) for c in path}


def test_busy_is_the_union_of_call_intervals():
    from types import SimpleNamespace

    def call(a, b):
        return SimpleNamespace(start=a, stop=lambda now, b=b: b)

    assert tv.busy([call(0, 1), call(0.5, 2), call(10, 11)], now=20) == pytest.approx(3.0)
    assert tv.busy([], now=1) == 0.0


def test_filters(traces):
    trace = Trace.load(traces["tree_of_thoughts"])
    decodes = tv.calls(trace, tv.Filter(kind="decode"))
    assert decodes and all(c.kind == "decode" for c in decodes)
    voters = tv.calls(trace, tv.Filter(agent="voter"))
    assert voters and all("voter" in c.agent for c in voters)
    late = tv.calls(trace, tv.Filter(since=trace.end_t))
    assert len(late) < len(trace.calls)


def test_timeline_draws_overlapping_calls_on_their_own_rows(traces):
    trace = Trace.load(traces["tree_of_thoughts"])
    lanes = tv.Timeline(trace)._lanes()
    proposer = lanes["proposer"]
    assert len(proposer) == 4  # 4 branches decoded together: 4 rows
    text = render(tv.Timeline(trace), width=100)
    assert text.count("┃") >= len([c for c in trace.calls.values() if c.kind == "decode"])


def test_segments_place_parents_where_they_sat(traces):
    trace = Trace.load(traces["parallel_debate"])
    for c in trace.calls.values():
        segs = tv.segments(trace, c)
        parents = [s for s in segs if s[0].startswith("m")]
        assert len(parents) == len(c.end.parents)
        placed = dict(zip(c.end.parents, c.end.offsets, strict=True))
        for what, a, b, _ in parents:
            mid = int(what[1:])
            assert a == placed[mid] and b - a == trace.messages[mid].tokens
        assert [a for _, a, _, _ in parents] == sorted(a for _, a, _, _ in parents)
        new = next(s for s in segs if s[0] == "new")
        assert new[1] == c.end.new_offset


def test_call_detail_unknown_call(traces):
    trace = Trace.load(traces["debate"])
    with pytest.raises(KeyError):
        tv.call_detail(trace, 10**6)


def test_task_groups_show_which_calls_were_submitted_together(traces):
    """A tree of thoughts asks its proposers in one fused batch: one task group."""
    trace = Trace.load(traces["tree_of_thoughts"])
    groups = tv.group_of(trace)
    proposers = [c.id for c in tv.calls(trace, tv.Filter(agent="proposer"))]
    assert len({groups[c] for c in proposers}) == 1
    text = render(tv.lineage(trace), width=160)
    assert groups[proposers[0]] in text


def test_steps_summarise_the_loop_per_engine(traces):
    """Durations, widths, calls a policy left out and the admission share, per engine
    (a merged trace's workers apart), computed from the step events."""
    from corps.engine.trace.events import Step

    trace = Trace.load(traces["debate"])

    def step(t, ms, calls, queue, rows, stepped, admit_ms, evicted=0, recomputed=0) -> Step:
        return Step(
            t=t, dur=ms / 1000, calls=calls, sampled=1, store_used=10, capacity=100,
            queue=queue, rows=rows, stepped=stepped, admit_s=admit_ms / 1000,
            evicted=evicted, recomputed=recomputed,
        )  # fmt: skip

    trace.steps = [
        step(0.0, 10, calls=2, queue=1, rows=2, stepped=2, admit_ms=1),
        step(0.1, 30, calls=3, queue=4, rows=9, stepped=1, admit_ms=2, evicted=12, recomputed=5),
        step(0.2, 20, calls=1, queue=0, rows=1, stepped=1, admit_ms=3),
        step(0.3, 50, calls=5, queue=7, rows=40, stepped=5, admit_ms=0),
    ]
    trace.step_processes = [None, None, None, "worker-2"]
    text = render(tv.steps(trace), width=200)
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line.strip()}
    # engine: 3 steps, ms p50 20 / p99 30 / max 30, rows 4.0 avg / 9 max, calls 2.0 / 3,
    # one step left a running call out, admission 6 of 60 ms, queue at most 4,
    # 12 tokens evicted and 5 recomputed
    want = ["3", "20.0/30.0/30.0", "4.0/9", "2.0/3", "1", "10%", "4", "12/5"]
    assert rows["engine"][1:] == want
    want = ["1", "50.0/50.0/50.0", "40.0/40", "5.0/5", "0", "0%", "7", "0/0"]
    assert rows["worker-2"][1:] == want
    fit = tv.step_fit(trace.steps[:3])  # the engine's steps have a fit, the worker's one not
    assert "engine: a step took" in text and f"{fit[0]:.1f} ms + {fit[1]:.2f} ms a call" in text
    assert "worker-2: a step took" not in text
    trace.steps, trace.step_processes = [], []
    assert tv.steps(trace) is None  # a trace without steps shows no table


def test_the_step_fit_recovers_a_known_cost():
    """Steps timed as 25 ms + 2 ms a call + 0.5 ms a row (calls counted as stepped):
    the fit gives those back; steps of one size cannot tell them apart."""
    from corps.engine.trace.events import Step

    def step(calls, rows, stepped=None) -> Step:
        ran = calls if stepped is None else stepped
        return Step(dur=(25 + 2 * ran + 0.5 * rows) / 1000, calls=calls, sampled=1,
                    store_used=1, capacity=9, queue=0, rows=rows, stepped=ran)  # fmt: skip

    steps = [step(c, r) for c in (1, 2, 4, 8) for r in (c, c + 30, c + 200)]
    steps.append(step(6, 40, stepped=3))  # a policy left 3 of 6 out: 3 calls ran
    fixed, per_call, per_row, per_chunk, per_keys = tv.step_fit(steps)
    assert (fixed, per_call, per_row) == pytest.approx((25, 2, 0.5), rel=1e-4)
    assert per_chunk == per_keys == 0  # these steps record neither
    assert "chunk" not in tv.describe_fit((25, 2, 0.5, 0, 0))
    assert tv.step_fit([step(2, 10)] * 5) is None


def test_workflows_split_each_latency_into_running_queued_and_between(traces):
    """Hand-built calls of two workflows (and one outside any): latency, the shares
    running / queued / between calls, and the steps run while a call of theirs ran."""
    from corps.engine.trace.events import CallEnd, CallQueued, Step
    from corps.engine.trace.reader import CallRec

    trace = Trace.load(traces["debate"])

    def call(i, workflow, queued, admitted, end) -> CallRec:
        q = CallQueued(t=queued, call=i, kind="decode", workflow=workflow)
        return CallRec(q, end=CallEnd(t=end, call=i, kind="decode", status="ok",
                                      admitted=admitted))  # fmt: skip

    trace.calls = {
        1: call(1, "a", 0.0, 0.5, 2.0),  # queued 0.5 s, then runs 1.5 s
        2: call(2, "a", 2.5, 2.5, 4.0),  # 0.5 s after call 1 ended (its code): runs 1.5 s
        3: call(3, "b", 1.0, 1.0, 1.5),
        4: call(4, None, 0.0, 0.0, 9.0),  # outside any workflow: not shown
    }

    def step(start, ms) -> Step:
        return Step(t=start, dur=ms / 1000, calls=1, sampled=1, store_used=1, capacity=9,
                    queue=0)  # fmt: skip

    # midpoints 1.0 (a and b running), 2.2 (between a's calls), 3.0 (a running)
    trace.steps = [step(0.99, 20), step(2.15, 100), step(2.98, 40)]
    trace.step_processes = [None] * 3
    a, b = tv.workflow_times(trace)  # slowest first
    assert (a.name, a.calls, b.name, b.calls) == ("a", 2, "b", 1)
    assert a.latency == pytest.approx(4.0) and b.latency == pytest.approx(0.5)
    assert (a.running, a.queued, a.between) == pytest.approx((3.0, 0.5, 0.5))
    assert (b.running, b.queued, b.between) == pytest.approx((0.5, 0.0, 0.0))
    assert (a.steps, a.step_ms, b.steps, b.step_ms) == (2, pytest.approx(30.0), 1,
                                                        pytest.approx(20.0))  # fmt: skip
    text = render(tv.workflows(trace), width=120)
    assert "slowest 2 of 2" in text
    line = next(x.split() for x in text.splitlines() if x.strip().startswith("a "))
    assert line[1:] == ["2", "4.00", "75%", "12%", "12%", "2", "30.0"]
    # a merged trace: only the steps of the engine a workflow's calls ran in count
    trace.calls[3].process, trace.step_processes = "worker-2", ["worker-2", None, None]
    a, b = tv.workflow_times(trace)
    assert (a.steps, a.step_ms, b.steps, b.step_ms) == (1, pytest.approx(40.0), 1,
                                                        pytest.approx(20.0))  # fmt: skip
    trace.calls = {4: trace.calls[4]}
    assert tv.workflows(trace) is None  # no call of any workflow: no table


def test_a_workflow_that_waited_at_the_gate_starts_when_it_arrived_there(traces):
    """With `max_workflows` a run may wait at the engine's gate before its first call:
    that wait is its own share (gate), and the latency counts from its arrival."""
    from corps.engine.trace.events import CallEnd, CallQueued, Gate
    from corps.engine.trace.reader import CallRec

    trace = Trace.load(traces["debate"])
    q = CallQueued(t=2.0, call=1, kind="decode", workflow="a")
    trace.calls = {1: CallRec(q, end=CallEnd(t=4.0, call=1, kind="decode", status="ok",
                                             admitted=2.0))}  # fmt: skip
    trace.steps, trace.step_processes = [], []
    trace.gates = {"a": Gate(t=1.5, run="a", waited=1.0)}  # arrived 0.5, entered 1.5
    (a,) = tv.workflow_times(trace)
    assert a.latency == pytest.approx(3.5) and a.gated == pytest.approx(1.0)
    assert (a.running, a.queued, a.between) == pytest.approx((2.0, 0.0, 0.5))
    text = render(tv.workflows(trace), width=120)
    line = next(x.split() for x in text.splitlines() if x.strip().startswith("a "))
    assert line[1:6] == ["1", "3.50", "29%", "57%", "0%"]  # calls, latency, gate, running, queued
    assert "gate: waiting to start" in text


async def test_a_repaired_call_says_what_it_recomputed(tiny_dirs, tmp_path):
    from conftest import open_tiny

    path = tmp_path / "repair.jsonl"  # uncapped: what the policy recomputes, as it chose
    async with open_tiny(tiny_dirs, "llama", trace=path, repair_bound=False) as engine:
        sys = await engine.prefill("you are a careful solver", role="system")
        q1 = await engine.prefill("what is seven times six", parents=[sys])
        q2 = await engine.prefill("name a prime", parents=[sys], offsets=[0])
        h = await engine.decode(parents=[sys, q1, q2], max_tokens=3, repair="first:2")
    trace = Trace.load(path)
    call = next(c for c in trace.calls.values() if c.end and c.end.message == h.id)
    assert (call.end.repaired, call.end.repair) == (2, "first:2")
    assert "repaired 2 (first:2)" in render(tv.call_detail(trace, call.id), width=200)


async def test_a_call_that_read_a_shared_repair_says_so(tiny_dirs, tmp_path):
    """Three readers of one context under one repair: one recomputed, two read its
    repaired context; the trace and the viewer tell them apart."""
    from conftest import open_tiny

    path = tmp_path / "shared.jsonl"
    async with open_tiny(tiny_dirs, "llama", trace=path, repair_bound=False) as engine:
        sys = await engine.prefill("you are a careful solver", role="system")
        q1 = await engine.prefill("what is seven times six", parents=[sys])
        q2 = await engine.prefill("name a prime", parents=[sys], offsets=[0])
        got = await engine.decode_many(
            [dict(parents=[sys, q1, q2], max_tokens=3, repair="full") for _ in range(3)]
        )
    trace = Trace.load(path)
    ends = [c.end for c in trace.calls.values() if c.end and c.end.message in {h.id for h in got}]
    assert sorted((e.repaired, e.repair) for e in ends) == [(0, "full"), (0, "full"),
                                                            (q2.length, "full")]  # fmt: skip
    reader = next(c for c in trace.calls.values() if c.end in ends and not c.end.repaired)
    text = render(tv.call_detail(trace, reader.id), width=200)
    assert "read a context another call repaired (full)" in text


def test_audits_and_auto_repair_switches_are_shown(traces, tmp_path):
    """An audited call's detail gives its gap; a switch of repair="auto" is listed."""
    lines = traces["debate"].read_text().splitlines()
    decode = next(c for c in Trace.load(traces["debate"]).calls.values() if c.kind == "decode")
    extra = [
        f'{{"type":"audited","t":1.0,"call":{decode.id},"shadow":999,"workflow":"debate",'
        '"agent":"judge","repair":"none","positions":8,"gap":0.0123,"agreement":0.75,"tokens":40}',
        '{"type":"repair_switch","t":1.1,"workflow":"debate","agent":"judge","before":"none",'
        '"after":"first:4","gap":0.05,"why":"high"}',
    ]
    path = tmp_path / "audited.jsonl"
    path.write_text("\n".join(lines[:-1] + extra + lines[-1:]) + "\n")
    trace = Trace.load(path)
    detail = render(tv.call_detail(trace, decode.id), width=200)
    assert "gap 0.0123" in detail and "agreement 75%" in detail
    text = render(tv.problems(trace), width=200)
    assert "none -> first:4 (high" in text
    shadow = next(c for c in trace.calls if c != decode.id)
    trace.audits[decode.id] = trace.audits[decode.id].model_copy(update={"shadow": shadow})
    assert "the shadow of call" in render(tv.call_detail(trace, shadow), width=200)
