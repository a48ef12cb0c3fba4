"""engine/exec/finish.py: a call's message registered; a final reply set aside (not kept
encoded), and encoded again from its tokens if a call reads it after all."""

from __future__ import annotations

import pytest

from corps.engine.errors import InvalidRequest
from corps.engine.exec.finish import chunked

from conftest import open_tiny

ASK = dict(max_tokens=6, temperature=0.0, ignore_eos=True)


@pytest.mark.parametrize(("n", "chunk", "spans"), [(0, 4, []), (3, 4, [3]), (8, 4, [4, 4]),
                                                    (9, 4, [4, 4, 1])])  # fmt: skip
def test_chunked_spans_cover_every_token_within_the_chunk(n, chunk, spans):
    assert chunked(n, chunk) == spans and sum(spans) == n


async def test_a_final_reply_encodes_what_the_baseline_encodes_and_keeps_no_slots(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine:
        q = await engine.prefill("What is 7*6?", role="user")
        kept = await engine.decode(parents=[q], **ASK)
        used = engine.stats().tokens_used
        final = await engine.decode(parents=[q], final=True, **ASK)
        # the same reply and message; its last token and the footer never ran
        assert final.tokens == kept.tokens and final.text == kept.text
        footer = len(engine.chat.frame_ids("assistant")[1])
        assert kept.tokens_encoded - final.tokens_encoded == 1 + footer
        assert engine.stats().tokens_used == used  # its slots went back
        engine.check()
    async with open_tiny(tiny_dirs, "llama", mode="baseline") as engine:
        q = await engine.prefill("What is 7*6?", role="user")
        base = await engine.decode(parents=[q], final=True, **ASK)
        # the baseline never encodes a reply's tail: what `final` saves is that
        assert base.tokens_encoded == final.tokens_encoded + q.length
        engine.check()


async def test_reading_a_final_reply_encodes_it_again_as_a_prefill_would(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine:
        q = await engine.prefill("What is 7*6?", role="user")
        final = await engine.decode(parents=[q], final=True, **ASK)
        twin = await engine.prefill(
            list(final.tokens), frame=False, role="assistant", parents=[q],
            new_offset=final.offset,
        )  # fmt: skip
        before = engine.stats().tokens_recomputed
        read = dict(max_tokens=5, temperature=0.0, ignore_eos=True, logprobs=True)
        a = await engine.decode(parents=[q, final], **read)
        b = await engine.decode(parents=[q, twin], **read)
        # its tokens in one prefill span over the same parents at the same offsets: the
        # same encoding, so the reader decodes the same, to the last bit
        assert a.tokens == b.tokens and a.logprobs == b.logprobs
        assert engine.stats().tokens_recomputed - before == final.length
        again = await engine.decode(parents=[q, final], **read)  # kept now: no recompute
        assert again.tokens == a.tokens
        assert engine.stats().tokens_recomputed - before == final.length
        engine.check()


@pytest.mark.parametrize("bad", ["yes", 1, None, [True]])
async def test_final_must_be_a_bool_and_a_refusal_changes_nothing(tiny_dirs, bad):
    async with open_tiny(tiny_dirs, "llama") as engine:
        q = await engine.prefill("Hi", role="user")
        before = engine.stats()
        with pytest.raises(InvalidRequest, match="final must be True or False"):
            await engine.decode(parents=[q], final=bad, **ASK)
        after = engine.stats()
        assert (after.messages, after.tokens_used) == (before.messages, before.tokens_used)
        engine.check()


@pytest.mark.parametrize("tokens", [1, 3])
async def test_final_readers_of_one_repair_share_it(tiny_dirs, tokens):
    """Final decodes repairing one context alike (a tree of thoughts' ballots): one
    builds and repairs it, the others wait for its rows and join it. Its builder
    closes its turn although final (a one-token reply would otherwise give the
    context back in the step its rows ran, before they join): none builds a context
    of its own, and each decodes what a lone repaired call decodes."""
    async with open_tiny(tiny_dirs, "llama", repair_bound=False) as engine:
        sys = await engine.prefill("You are a careful solver.", role="system")
        q1 = await engine.prefill("What is seven times six?", parents=[sys])
        q2 = await engine.prefill("Name a prime above ten.", parents=[sys], offsets=[0])
        ask = dict(parents=[sys, q1, q2], max_tokens=tokens, temperature=0.0,
                   ignore_eos=True, repair="full")  # fmt: skip
        alone = await engine.decode(**ask)
        before = engine.stats().tokens_repaired
        got = await engine.decode_many([dict(final=True, **ask)] * 4)
        assert [h.tokens for h in got] == [alone.tokens] * 4
        assert sorted(h.tokens_repaired for h in got) == [0, 0, 0, alone.tokens_repaired]
        assert engine.stats().tokens_repaired - before == alone.tokens_repaired > 0
        assert all(h.tokens_repair_cut == 0 for h in got)
        engine.check()


async def test_a_final_reply_read_in_a_full_store_evicts_to_come_back(tiny_dirs):
    """Encoding a set-aside reply again needs room like any call: in a store too small
    for it beside the other messages, reading it evicts one no call reads (and that
    one comes back the same way when read), and nothing is left over."""
    async with open_tiny(tiny_dirs, "llama", capacity=200) as tight:
        q = await tight.prefill("alpha beta gamma delta " * 2)
        final = await tight.decode(parents=[q], max_tokens=40, ignore_eos=True, final=True)
        other = await tight.prefill("one two three four five " * 6)
        read = dict(max_tokens=4, temperature=0.0, ignore_eos=True)
        await tight.decode(parents=[q, final], **read)
        b = await tight.decode(parents=[other], **read)
        stats = tight.stats()
        assert stats.tokens_recomputed >= final.length and stats.messages_evicted >= 1
        tight.check()
    async with open_tiny(tiny_dirs, "llama") as roomy:  # the same calls with room to spare
        q = await roomy.prefill("alpha beta gamma delta " * 2)
        kept = await roomy.decode(parents=[q], max_tokens=40, ignore_eos=True)
        other = await roomy.prefill("one two three four five " * 6)
        assert kept.tokens == final.tokens
        # the evicted prefill came back step for step: its reader decodes the same
        assert (await roomy.decode(parents=[other], **read)).tokens == b.tokens
