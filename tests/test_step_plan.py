"""exec/step_plan.py: a step's rows decided from hand-built calls (no model, no store)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corps.engine.exec.step_plan import (
    BUCKETS,
    PREFILL_CHUNK,
    PREFILL_SHARE,
    Rows,
    StepPlan,
    decode_keys,
    plan_rows,
)

from helpers import bare_call as call
from helpers import plan_shape as shape


def test_decodes_first_then_prompt_chunks_in_order():
    p1, d1, p2, d2 = call(feed=5), call(fed=4, pending=7), call(feed=3), call(fed=4, pending=8)
    plan = plan_rows([p1, d1, p2, d2])
    assert [e.call for e in plan.entries] == [d1, d2, p1, p2]
    assert shape(plan) == [(-1, 1), (-1, 1), (0, 5), (0, 3)]
    assert plan.rows == 10 and plan.chunks == 2


def test_a_decoding_call_brings_its_jumped_tokens_and_its_footer():
    c = call(fed=4, pending=7, jumped=[1, 2], closing=[3, 4, 5])
    assert c.next_rows() == 6
    assert shape(plan_rows([c])) == [(-1, 6)]


def test_a_long_prompt_is_chunked_and_the_budget_cuts_the_last_chunk():
    long, short = call(feed=PREFILL_CHUNK + 100), call(feed=50)
    assert shape(plan_rows([long, short])) == [(0, PREFILL_CHUNK), (0, 50)]
    assert shape(plan_rows([long, short], budget=530)) == [(0, PREFILL_CHUNK), (0, 18)]
    long.fed = PREFILL_CHUNK
    assert long.next_rows() == 100


def test_prefills_keep_a_share_of_a_full_step_of_decodes():
    decodes = [call(fed=4, pending=1) for _ in range(8)]
    long = call(feed=100)
    plan = plan_rows([*decodes, long], budget=8)
    assert shape(plan) == [(-1, 1)] * (8 - 8 // PREFILL_SHARE) + [(0, 8 // PREFILL_SHARE)]


def test_a_recompute_runs_its_recorded_spans_whole_or_waits():
    c = call(feed=6, first_spans=[1, 5])
    assert shape(plan_rows([c])) == [(0, 1)]
    c.fed, c.spans = 1, [1]
    assert c.next_rows() == 5
    assert shape(plan_rows([c], budget=4)) == []  # 5 rows do not fit: it waits a step
    assert shape(plan_rows([c], budget=5)) == [(1, 5)]


def test_a_call_with_nothing_left_brings_no_rows():
    assert call(feed=3, fed=3).next_rows() == 0
    assert not plan_rows([call(feed=3, fed=3)])


def test_decode_only_plans_fit_a_bucket_others_run_exact():
    decodes = [call(fed=4, pending=1) for _ in range(5)]
    assert plan_rows(decodes).bucket == 8
    assert plan_rows(decodes[:1]).bucket == 1
    assert plan_rows([*decodes, call(feed=2)]).bucket is None  # a prompt chunk
    assert plan_rows([call(fed=4, pending=1, jumped=[2])]).bucket is None  # two rows
    many = [call(fed=4, pending=1) for _ in range(BUCKETS[-1] + 1)]
    assert plan_rows(many).bucket is None
    assert StepPlan(()).bucket is None


def brute_force(calls, budget):
    """The rules of the module docstring, written plainly."""
    left = budget
    prefilling = sum(len(c.feed) - c.fed for c in calls if c.pending is None)
    share = min(prefilling, max(1, left // PREFILL_SHARE))
    out, used_by_decodes = [], 0
    for c in calls:
        if c.pending is None:
            continue
        if used_by_decodes >= left - share:
            break
        n = 1 + len(c.jumped) + len(c.closing)
        out.append((id(c), -1, n))
        used_by_decodes += n
    left -= used_by_decodes
    for c in calls:
        rest = len(c.feed) - c.fed
        if c.pending is None and rest > 0 and left > 0:
            n = min(rest, PREFILL_CHUNK, left)
            out.append((id(c), c.fed, n))
            left -= n
    return out


calls_st = st.lists(
    st.one_of(
        st.builds(
            lambda f, d: call(feed=f, fed=min(d, f)), st.integers(1, 1200), st.integers(0, 1200)
        ),
        st.builds(
            lambda j, k: call(fed=4, pending=1, jumped=[2] * j, closing=[3] * k),
            st.integers(0, 3),
            st.integers(0, 3),
        ),
    ),
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(calls_st, st.integers(1, 2048))
def test_plan_rows_matches_the_rules_written_plainly(calls, budget):
    plan = plan_rows(calls, budget)
    assert [(id(e.call), e.start, e.n) for e in plan.entries] == brute_force(calls, budget)
    assert plan.calls == tuple(calls)
    # nothing read is changed, and a plan is the same when made twice
    assert shape(plan_rows(calls, budget)) == shape(plan)


def test_rows_is_frozen():
    r = Rows(call(), 0, 1)
    with pytest.raises(AttributeError):
        r.n = 2  # type: ignore[misc]


def test_decode_keys_sum_the_views():
    assert decode_keys([]) == 0
    assert decode_keys([300]) == 300
    assert decode_keys([100, 1500, 200]) == 1800


def test_a_gpu_takes_longer_prompt_chunks():
    from corps.engine.exec.step_plan import GPU_PREFILL_CHUNK, prefill_chunk_for

    assert prefill_chunk_for("cpu") == PREFILL_CHUNK
    assert prefill_chunk_for("cuda:0") == GPU_PREFILL_CHUNK > PREFILL_CHUNK
    long = call(feed=3000)
    assert shape(plan_rows([long], chunk=GPU_PREFILL_CHUNK)) == [(0, 3000)]
    assert shape(plan_rows([long], budget=1000, chunk=GPU_PREFILL_CHUNK)) == [(0, 1000)]
