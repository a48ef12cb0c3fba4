"""exec/call.py: a call's status through its transitions, the one formula of what it
may still generate, going back to queued (`unplan`), on hand-built calls (no planner,
no store); and its caller's side in the loop (its callbacks fail that call alone)."""

from __future__ import annotations

from dataclasses import fields

import pytest
import torch

from corps.engine.exec.call import Call, CallPlan
from corps.engine.request.requests import decode_request
from corps.engine.request.sampling_params import SamplingParams

from conftest import open_tiny
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


def test_unplan_puts_every_field_the_executor_writes_back_and_keeps_the_caller_s():
    c = bare_call(feed=5, fed=2, pending=7)
    c.request, c.id, c.want_logits, c.keep, c.pins = "req", 9, True, 3, ["pin"]
    c.slots, c.spare, c.generated, c.encoded, c.text = [1, 2], [3], [7], 2, "t"
    c.logits.append(torch.zeros(2))
    c.mark_done()
    c.unplan()
    fresh = Call()
    kept = {"request", "id", "want_logits", "keep", "pins", "workflow", "objective",
            "critical", "group", "leaks", "replayed", "ended", "on_token", "on_done",
            "handle", "error", "cancelled", "submitted", "admitted", "first_token",
            "emitted", "skipped", "charged"}  # fmt: skip
    planned = [f.name for f in fields(Call) if f.name not in kept]
    assert {"plan", "feed", "slots", "spare", "generated", "text", "fed", "logits"} <= set(planned)
    for name in planned:
        assert getattr(c, name) == getattr(fresh, name), name
    assert c.logits is not fresh.logits  # a fresh list, not a shared default
    assert (c.request, c.id, c.want_logits, c.keep, c.pins) == ("req", 9, True, 3, ["pin"])
    assert c.status == "queued"


PROMPTS = ["hello world", "the quick brown fox", "what is seven", "you are a careful solver"]


async def test_a_failing_callback_fails_its_call_only(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine:
        q = await engine.prefill("hello world")
        messages = engine.stats().messages

        def explode(tok: int) -> None:
            raise RuntimeError("callback broke")

        call = await engine._submit.call(
            decode_request(dict(parents=[q], max_tokens=8, ignore_eos=True))
        )
        call.on_token = explode
        other = engine.decode(parents=[q], max_tokens=8, ignore_eos=True)
        await engine._sched.submit(call)
        with pytest.raises(RuntimeError, match="callback broke"):
            await call.wait()
        assert len((await other).tokens) > 0  # the engine is alive and serving
        await engine.prefill("x")
        assert engine.stats().messages == messages + 2  # other and "x"; nothing of the call
        live = sum(m.slots for m in engine.messages())
        assert engine.stats().tokens_used == live


async def test_a_call_cancelled_in_the_step_that_finished_it_frees_its_message():
    """Its waiter is gone (a stream left, a callback failed): nobody will take the
    message, so ending the call gives it back (found by `corps serve`'s disconnect test:
    a stream cut as its last step ran left its reply in the store)."""
    from corps.engine.sched.scheduler import Scheduler

    class Executor:  # the two calls `Scheduler.end` makes of it, recorded
        def __init__(self):
            self.freed, self.table = [], None

        def unpin(self, msgs):
            pass

        def free(self, handle):
            self.freed.append(handle)

    core = Executor()
    core.table = type("T", (), {"get": lambda self, i: type("M", (), {})()})()
    sched = Scheduler(core)
    call = Call.queued(None)
    call.handle, call.cancelled = "the message", True
    sched.end(call)
    assert core.freed == ["the message"] and call.handle is None and call.ended.is_set()
    kept = Call.queued(None)
    kept.handle = type("H", (), {"id": 0})()
    sched.end(kept)
    assert core.freed == ["the message"] and kept.handle is not None
