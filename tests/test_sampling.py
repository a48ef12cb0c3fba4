"""Sampling (corps.engine.sampling)."""

from __future__ import annotations

import pytest
import torch

from corps.engine.errors import InvalidRequest
from corps.engine.sampling import SamplingParams, sample

LOGITS = torch.tensor([0.1, 2.0, 1.9, -1.0, 0.5])


def draws(params, n=200):
    gen = params.generator()
    return [sample(LOGITS, params, gen) for _ in range(n)]


def test_greedy_is_argmax():
    assert sample(LOGITS, SamplingParams(), None) == 1


def test_seeded_is_reproducible_and_varies():
    p = SamplingParams(temperature=1.0, seed=3)
    assert draws(p) == draws(p)
    assert len(set(draws(p))) > 2


def test_top_k_and_top_p_restrict_support():
    assert set(draws(SamplingParams(temperature=2.0, top_k=2, seed=0))) == {1, 2}
    assert set(draws(SamplingParams(temperature=1.0, top_p=0.01, seed=0))) == {1}
    assert set(draws(SamplingParams(temperature=1.0, top_p=0.6, seed=0))) == {1, 2}


@pytest.mark.parametrize(
    "bad",
    [
        dict(max_tokens=0),
        dict(max_tokens=1.5),
        dict(temperature=-1),
        dict(top_p=0.0),
        dict(top_k=-1),
        dict(stop=("",)),
    ],
)
def test_bad_params(bad):
    with pytest.raises(InvalidRequest):
        SamplingParams(**bad)


def test_force_emits_exactly_the_forced_tokens():
    params = SamplingParams(max_tokens=3, force=(4, 9, 2), temperature=1.0)
    logits = torch.zeros(16)
    assert [sample(logits, params, None, i) for i in range(3)] == [4, 9, 2]
    with pytest.raises(InvalidRequest, match="max_tokens"):
        SamplingParams(max_tokens=2, force=(1, 2, 3))
    with pytest.raises(InvalidRequest, match="token ids"):
        SamplingParams(force=(1, -2))
