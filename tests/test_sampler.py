"""engine/exec/sampler.py: picks, forced tokens, stops, the closing footer and the text."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from corps.engine.errors import InvalidRequest
from corps.engine.exec.draw import sample
from corps.engine.exec.sampler import Sampler
from corps.engine.request.sampling_params import SamplingParams

EOT, NL = 99, 98


class _Fmt:
    stop_ids = frozenset({EOT})

    def decode(self, ids):
        return "".join(chr(97 + (t % 26)) for t in ids)


def _call(generated=(), matcher=None, **sampling):
    params = SamplingParams(**sampling)
    plan = SimpleNamespace(sampling=params)
    return SimpleNamespace(
        plan=plan, generated=list(generated), generator=params.generator(), matcher=matcher
    )


def test_stops_say_why_on_max_tokens_end_of_turn_stop_strings_forced_and_constraints():
    s = Sampler(_Fmt())
    assert s.stops(_call([5, 6], max_tokens=2), 6) == "max_tokens"
    assert s.stops(_call([5], max_tokens=2), 5) is None
    assert s.stops(_call([5, EOT]), EOT) == "end_of_turn"
    assert s.stops(_call([5, EOT], ignore_eos=True), EOT) is None
    assert s.stops(_call([0, 1], stop=["ab"]), 1) == "stop_string"  # text "ab"
    assert s.stops(_call([0, 2], stop=["ab"]), 2) is None
    forced = _call([9], force=(9, 9), max_tokens=5)
    assert s.stops(forced, 9) is None
    assert s.stops(_call([9, 9], force=(9, 9), max_tokens=5), 9) == "forced"
    done = SimpleNamespace(is_stopped=lambda: True)
    assert s.stops(_call([5], matcher=done), 5) == "constraint"
    going = SimpleNamespace(is_stopped=lambda: False)
    assert s.stops(_call([5], matcher=going), 5) is None


def test_a_turn_is_closed_by_the_rest_of_its_footer():
    s = Sampler(_Fmt())
    assert s.closing([EOT, NL], EOT) == [NL]  # ended on end of turn: its newline
    assert s.closing([EOT, NL], 7) == [EOT, NL]  # cut by max_tokens: the whole footer


def test_text_drops_end_of_turn_and_cuts_before_a_stop_string():
    s = Sampler(_Fmt())
    assert s.text([0, 1, 2, EOT], SamplingParams()) == "abc"
    assert s.text([0, 1, 2, 3], SamplingParams(stop=("c",))) == "ab"


def test_picks_greedy_rows_by_argmax_and_sampled_rows_as_they_draw_alone():
    s = Sampler(_Fmt())
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 50, generator=g)
    greedy = _call()
    sampled = _call(temperature=0.9, top_k=10, seed=7)
    picks = s.picks([(greedy, 1), (sampled, 3)], logits)
    assert picks[1] == int(logits[1].argmax())
    alone = sample(
        logits[3], sampled.plan.sampling, _call(temperature=0.9, top_k=10, seed=7).generator, 0
    )
    assert picks[3] == alone and set(picks) == {1, 3}


def test_next_token_replays_a_forced_token_and_draws_alone_without_a_pick():
    s = Sampler(_Fmt())
    logits = torch.zeros(1, 10)
    logits[0, 4] = 5.0
    assert s.next_token(_call(force=(8,), max_tokens=1), logits, pick=4) == 8
    assert s.next_token(_call(), logits, pick=None) == 4


def test_a_seed_of_any_size_is_a_seed_reduced_to_the_generator_s_range():
    """manual_seed refuses past 64 bits; a client's 10**23 (or -1) is still a seed, the
    same one as its value modulo 2**64, and seeds in range draw as they always did."""

    def draws(seed):
        return torch.rand(4, generator=SamplingParams(temperature=1.0, seed=seed).generator())

    assert torch.equal(draws(10**23), draws(10**23 % 2**64))
    assert torch.equal(draws(-1), draws(2**64 - 1))
    assert torch.equal(draws(7), torch.rand(4, generator=torch.Generator().manual_seed(7)))


def test_logit_bias_bans_favours_and_shifts_in_one_batched_write():
    """-100 bans a token (never drawn, even as argmax), +100 leaves only the biased
    tokens, a small bias adds to the score; rows without a bias are untouched."""
    from corps.engine.exec.draw import bias

    logits = torch.tensor([[5.0, 1.0, 0.0], [5.0, 1.0, 0.0], [5.0, 1.0, 0.0], [5.0, 1.0, 0.0]])
    params = [
        SamplingParams(logit_bias={0: -100}),
        SamplingParams(logit_bias={2: 100}),
        SamplingParams(logit_bias=((1, 4.5),)),
    ]
    bias(logits, [(0, params[0]), (1, params[1]), (2, params[2])])
    assert logits[0, 0] == float("-inf") and int(logits[0].argmax()) == 1
    assert logits[1].isinf().tolist() == [True, True, False]
    assert logits[2].tolist() == [5.0, 5.5, 0.0] and logits[3].tolist() == [5.0, 1.0, 0.0]
    for bad in ({-1: 1.0}, {3: 101.0}, {True: 1.0}):
        with pytest.raises(InvalidRequest):
            SamplingParams(logit_bias=bad)
