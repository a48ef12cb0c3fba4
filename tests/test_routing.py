"""engine/attention/routing.py: which rows of a step attend through one batched plan."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st


@pytest.mark.parametrize("capped", [False, True])
async def test_short_headers_over_a_shared_context_batch_and_match_each_call_alone(
    tiny_dirs, monkeypatch, capped
):
    """Voters' headers over one shared context go through one batched plan (spans of
    several rows), beside a decode and a long prompt in the same steps, unless their
    padded scores would pass the cap; every call decodes what it decodes alone."""
    from functools import partial

    import anyio

    from corps.engine.attention import SdpaAttention

    from conftest import open_tiny

    spans_batched = []
    real = SdpaAttention.attend_decode

    def spy(self, layer, q, k, v, plan, scale):
        if layer == 0 and plan.t > 1:
            spans_batched.append(plan.t)
        return real(self, layer, q, k, v, plan, scale)

    monkeypatch.setattr(SdpaAttention, "attend_decode", spy)
    if capped:
        monkeypatch.setattr("corps.engine.attention.routing.SHORT_SPAN_PAIRS", 0)
    async with open_tiny(tiny_dirs, "qwen3") as engine:
        ctx = await engine.prefill_many([dict(message=f"branch {i} " * 9) for i in range(4)])
        votes = [
            dict(parents=ctx, header=f"{i}" * (i + 2), max_tokens=5, ignore_eos=True)
            for i in range(4)
        ]
        long = dict(message="a long prompt " * 60)
        alone = [(await engine.decode(**kw)).tokens for kw in votes]
        assert not spans_batched  # one call at a time: nothing to batch
        together = {}

        async def vote(i: int) -> None:
            together[i] = (await engine.decode(**votes[i])).tokens

        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(engine.prefill, **long))
            for i in range(4):
                tg.start_soon(vote, i)
    assert bool(spans_batched) != capped  # the headers went through the batched plan
    assert [together[i] for i in range(4)] == alone


def _padded(groups: list[list[int]], lengths: list[int], overhead: int) -> int:
    return sum(overhead + len(g) * max(lengths[i] for i in g) for g in groups)


def _partitions(items: list[int]):
    """Every set partition of `items` (brute force, small lists)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in _partitions(rest):
        yield [[first], *part]
        for k in range(len(part)):
            yield [*part[:k], [first, *part[k]], *part[k + 1 :]]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(1, 3000), min_size=1, max_size=7),
    st.sampled_from([0, 1, 64, 512, 4096]),
)
def test_split_by_length_pads_no_more_than_any_partition(lengths, overhead):
    """Brute force over every set partition: the split's padded work (a plan's overhead
    plus its calls times its longest) is the least; it covers each call once, each
    group in batch order, and a single group is the batch in order."""
    from corps.engine.attention.routing import split_by_length

    groups = split_by_length(lengths, overhead)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    assert all(g == sorted(g) for g in groups)
    best = min(_padded(p, lengths, overhead) for p in _partitions(list(range(len(lengths)))))
    assert _padded(groups, lengths, overhead) == best
    if len(groups) == 1:
        assert groups == [list(range(len(lengths)))]


async def test_decodes_of_very_different_lengths_run_in_plans_of_their_own(tiny_dirs, monkeypatch):
    """Two short and two long views decoding together: two batched plans (one pads the
    short ones to the long ones' length no more), and every call decodes what it
    decodes alone."""
    from corps.engine.attention import SdpaAttention

    from conftest import open_tiny

    plans = []
    real = SdpaAttention.attend_decode

    def spy(self, layer, q, k, v, plan, scale):
        if layer == 0:
            plans.append(plan.ctx_len.shape[0])
        return real(self, layer, q, k, v, plan, scale)

    monkeypatch.setattr(SdpaAttention, "attend_decode", spy)
    monkeypatch.setattr(SdpaAttention, "plan_keys", 64)  # the tiny model's views are short
    async with open_tiny(tiny_dirs, "llama") as engine:
        texts = ["hi", "yo", "a long prompt to remember " * 30, "another long one, " * 40]
        qs = await engine.prefill_many([dict(message=t) for t in texts])
        kw = [dict(parents=[q], max_tokens=6, ignore_eos=True) for q in qs]
        alone = [(await engine.decode(**k)).tokens for k in kw]
        plans.clear()
        together = [h.tokens for h in await engine.decode_many(kw)]
    assert together == alone
    assert plans.count(2) >= 5  # steps of four decodes ran as two plans of two
    assert 4 not in plans
