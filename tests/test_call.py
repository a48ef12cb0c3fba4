"""exec/call.py: a call's status through its transitions, and the one formula of what
it may still generate, on hand-built calls (no planner, no store)."""

from __future__ import annotations

import torch

from corps.engine.exec.call import CallPlan
from corps.engine.request.sampling_params import SamplingParams

from helpers import bare_call


def test_a_decode_moves_waiting_prefilling_decoding_finishing_done():
    c = bare_call(feed=5)
    assert c.status == "waiting"
    assert not c.fed_rows(3) and c.status == "prefilling"
    assert c.fed_rows(2)  # the whole feed is encoded
    c.accept(11)
    assert c.status == "decoding" and c.pending == 11 and c.generated == [11]
    c.encoded_pending()
    assert c.status == "prefilling" and c.pending is None  # between tokens, nothing pending
    c.accept(12)
    c.finish_with("eos", closing=[7, 8])
    assert c.status == "finishing" and c.finish_reason == "eos" and c.closing == [7, 8]
    c.encoded_pending()  # its last token and footer encoded together
    assert c.status == "done" and c.closed == [7, 8] and c.closing == []


def test_jumped_tokens_count_as_generated_and_go_with_the_pending_token():
    c = bare_call(feed=2, fed=2)
    c.accept(5)
    c.jump([6, 7])
    assert c.generated == [5, 6, 7] and c.jumped == [6, 7]
    assert c.budget_left == SamplingParams().max_tokens - 3
    c.encoded_pending()
    assert c.jumped == [] and c.pending is None


def test_the_baseline_closes_a_turn_without_encoding_its_last_token():
    c = bare_call(feed=2, fed=2)
    c.accept(5)
    c.finish_with("max_tokens", closing=[9])
    c.close_unencoded()
    assert c.status == "done" and c.closed == [9] and c.pending is None


def test_accept_marks_the_token_of_a_scored_row_for_the_steps_note():
    c = bare_call(feed=1, fed=1)
    c.accept(3)
    assert c.scored is None  # no row: nothing to note
    c.scores = torch.log_softmax(torch.tensor([0.0, 2.0, 1.0]), dim=-1)
    c.accept(2)
    assert c.scored == 2 and c.logprobs == [] and c.pending == 2  # noted at the step's end


def test_generated_max_is_the_tokens_and_the_footer_or_nothing():
    common = dict(
        role="assistant", offset=0, parents=(), parent_offsets=(), owner=None,
        visibility=None, own=1, prefix=[1],
    )  # fmt: skip
    decode = CallPlan(kind="decode", sampling=SamplingParams(max_tokens=9), footer=(3, 4), **common)
    prefill = CallPlan(kind="prefill", **common)
    assert decode.generated_max == 11
    assert prefill.generated_max == 0
