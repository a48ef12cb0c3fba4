"""exec/scores.py: a step's log-probabilities taken for all its logprobs calls at once
are what each call's own row gives (the brute-force oracle: row by row)."""

from __future__ import annotations

import dataclasses

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from corps.engine.exec import scores
from corps.engine.exec.call import top_of
from corps.engine.request.sampling_params import SamplingParams

from helpers import bare_call


def scored_call(row, tok: int, top: int):
    c = bare_call(feed=1, fed=1)
    sampling = SamplingParams(logprobs=True, top_logprobs=top)
    c.plan = dataclasses.replace(c.plan, sampling=sampling)
    c.scores = row
    c.accept(tok)
    return c


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    tops=st.lists(st.integers(0, 6), min_size=1, max_size=6),
    vocab=st.integers(8, 3000),
)
def test_noting_together_is_noting_each_row_alone(seed, tops, vocab):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(tops) + 2, vocab, generator=gen) * 4
    rows = list(range(1, len(tops) + 1))
    lsm = scores.score_rows(logits, [*rows, 0])  # the last row: a call that took nothing
    tokens = torch.randint(vocab, (len(tops),), generator=gen).tolist()
    calls = [scored_call(lsm[i], t, k) for i, (t, k) in enumerate(zip(tokens, tops, strict=True))]
    idle = bare_call(feed=1, fed=1)  # scored, but it accepted no token: untouched
    idle.scores = lsm[-1]
    scores.note([*calls, idle], lsm)
    for i, (c, t, k) in enumerate(zip(calls, tokens, tops, strict=True)):
        row = torch.log_softmax(logits[rows[i]].float(), -1)  # alone
        assert c.logprobs == [float(row[t])]
        assert c.greedy == [int(row.argmax())]
        assert c.top == top_of(row, k)
        assert c.scores is None and c.scored is None
    assert idle.logprobs == [] and idle.greedy == [] and idle.top == []


def test_a_row_whose_call_took_no_token_is_left_as_it_was():
    lsm = scores.score_rows(torch.randn(2, 50), [0, 1])
    took, failed = scored_call(lsm[0], 3, 2), bare_call(feed=1, fed=1)
    failed.scores = lsm[1]  # its sampling failed: it accepted nothing
    scores.note([took, failed], lsm)
    assert len(took.logprobs) == 1 and failed.logprobs == [] and failed.scores is not None
