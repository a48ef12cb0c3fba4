"""Next-token draws (exec/draw.py) and the sampling parameters they read."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from corps.engine.errors import InvalidRequest, NonFiniteLogits
from corps.engine.exec import draw as sampling
from corps.engine.exec.draw import candidates, draw, sample, sample_rows
from corps.engine.request.sampling_params import SamplingParams

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


def test_a_forced_call_does_the_sampling_it_replays():
    """Benchmarks time forced runs as normal decoding: a forced sampled call draws
    from its generator exactly as the call it replays did, then emits its token."""
    logits = torch.randn(300)
    for params in (dict(temperature=0.7, top_p=0.95), dict(temperature=1.0, top_k=5)):
        free, forced = (
            SamplingParams(seed=1, **params),
            SamplingParams(seed=1, force=(3,), **params),
        )
        g_free, g_forced = free.generator(), forced.generator()
        sample(logits, free, g_free)
        assert sample(logits, forced, g_forced) == 3
        assert torch.equal(g_free.get_state(), g_forced.get_state())


def _oracle(logits: torch.Tensor, params: SamplingParams) -> set[int]:
    """The candidates by brute force: sort the whole vocabulary, cut to top_k,
    renormalise, keep the prefix before which less than top_p is gathered (top_p < 1)."""
    probs = torch.softmax(logits.float() / params.temperature, -1)
    order = torch.argsort(probs, descending=True)
    if params.top_k:
        order = order[: params.top_k]
    p = probs[order]
    if params.top_k:
        p = p / p.sum()
    if params.top_p < 1.0:
        order = order[torch.cumsum(p, 0) - p < params.top_p]
    return set(order.tolist())


@settings(max_examples=200, deadline=None)
@given(
    tenths=st.lists(st.integers(-100, 100), min_size=2, max_size=201, unique=True),
    temperature=st.sampled_from([0.3, 0.7, 1.0, 2.0]),
    top_k=st.integers(0, 120),
    top_p=st.sampled_from([0.05, 0.5, 0.9, 0.95, 0.999, 1.0]),
    first=st.sampled_from([1, 4, 64]),
)
def test_candidates_match_a_full_sort(tenths, temperature, top_k, top_p, first):
    """Whether a row's nucleus is found among its first few most likely tokens or needs
    the whole sort, and whatever the other rows need, its candidates are those of the
    brute-force rule, weighted by their probabilities. (Logits 0.1 apart within
    [-10, 10]: no two probabilities tie, none underflows, so the rule names one set.)"""
    x = torch.tensor(tenths) / 10
    rows = torch.stack([x, x.flip(0), x / 2, x / 8])  # peaked and flat rows side by side
    probs = torch.softmax(rows / temperature, -1)  # (4, V)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sampling, "NUCLEUS_FIRST", first)  # where the nucleus is looked for first
        ids, weights = candidates(probs, top_k, top_p)
    if ids is None:
        assert top_k == 0 and top_p == 1.0 and torch.equal(weights, probs)
        return
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    for row, i, w, p in zip(rows, ids, weights, probs, strict=True):
        kept = i[w > 0]
        assert set(kept.tolist()) == _oracle(row, params) and len(kept) == len(set(kept.tolist()))
        assert torch.equal(w[w > 0], p[kept])


def test_top_p_applies_to_the_top_k_renormalised():
    probs = torch.tensor([[0.4, 0.3, 0.1, 0.1, 0.1]])
    ids, weights = candidates(probs, 2, 0.5)  # top 2 renormalised: 0.57, 0.43
    assert ids[weights > 0].tolist() == [0]
    ids, weights = candidates(probs, 0, 0.5)  # no top-k: 0.4 is not enough alone
    assert ids[weights > 0].tolist() == [0, 1]


def test_draws_follow_the_weights_and_never_pick_a_zero():
    gen = torch.Generator().manual_seed(0)
    weights = torch.tensor([[0.0, 0.5, 0.0, 0.3, 0.2, 0.0]])
    picks = [draw(None, weights, [gen])[0] for _ in range(20000)]
    counts = torch.bincount(torch.tensor(picks), minlength=6) / len(picks)
    assert counts[0] == counts[2] == counts[5] == 0
    assert torch.allclose(counts, weights[0], atol=0.015)
    ids = torch.tensor([[40, 7, 9]])
    assert {draw(ids, torch.tensor([[1.0, 0.0, 3.0]]), [gen])[0] for _ in range(500)} == {40, 9}


def test_calls_sampled_together_draw_what_they_draw_alone():
    logits = torch.randn(6, 500) * 4
    params = [
        SamplingParams(temperature=t, top_p=p, top_k=k, seed=i)
        for i, (t, p, k) in enumerate(
            [
                (0.7, 0.95, 0),
                (1.3, 0.95, 0),
                (0.7, 1.0, 0),
                (1.0, 0.9, 20),
                (2.0, 1.0, 7),
                (0.5, 0.95, 0),
            ]
        )
    ]
    for _ in range(3):  # several draws each, generators advancing together
        gens = [p.generator() for p in params]
        alone_gens = [p.generator() for p in params]
        together = sample_rows(logits, params, gens)
        alone = [
            sample_rows(logits[i : i + 1], [p], [g])[0]
            for i, (p, g) in enumerate(zip(params, alone_gens, strict=True))
        ]
        assert together == alone and None not in together
        logits = logits.roll(1, -1)


def test_non_finite_logits_fail_that_call_only():
    logits = torch.randn(3, 50)
    logits[1, 4] = float("nan")
    params = [SamplingParams(temperature=0.8, top_p=0.9, seed=i) for i in range(3)]
    drawn = sample_rows(logits, params, [p.generator() for p in params])
    assert drawn[1] is None and None not in (drawn[0], drawn[2])
    with pytest.raises(NonFiniteLogits, match="float32"):
        sample(logits[1], params[1], params[1].generator())


PALETTE = [-math.inf, -1.0, 0.0, 0.5, 2.0, math.inf, math.nan]


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    rows=st.integers(1, 5),
    cols=st.integers(1, 5 * sampling.ARGMAX_BLOCK + 7),
    palette=st.lists(st.sampled_from(PALETTE), min_size=1, max_size=4),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.float16]),
)
def test_first_argmax_is_torchs_argmax(seed, rows, cols, palette, dtype):
    # few distinct values: ties everywhere, the maxima in any block, NaN and infinities
    gen = torch.Generator().manual_seed(seed)
    values = torch.tensor(palette)[torch.randint(len(palette), (rows, cols), generator=gen)]
    x = values.to(dtype)
    assert torch.equal(sampling.first_argmax(x), x.argmax(-1))
    assert sampling.argmax_rows(x) == x.argmax(-1).tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_first_argmax_reads_row_views(dtype):
    x = torch.randn(8, 3 * sampling.ARGMAX_BLOCK + 5).to(dtype)
    view = x[2:6]  # take_rows' view of an ascending run of rows
    assert torch.equal(sampling.first_argmax(view), view.argmax(-1))
    strided = x[:, 1::2]  # not contiguous
    assert torch.equal(sampling.first_argmax(strided), strided.argmax(-1))
