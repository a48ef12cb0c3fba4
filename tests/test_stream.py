"""engine/api/stream.py: TextStream, a decode's text deltas as they are generated."""

from __future__ import annotations

import anyio

from conftest import open_tiny


async def test_stream_yields_the_text(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine:
        q = await engine.prefill("hello world")
        stream = engine.stream(parents=[q], max_tokens=10, ignore_eos=True)
        deltas = [d async for d in stream]
        assert "".join(deltas) == stream.handle.text


async def test_leaving_a_finished_stream_frees_its_message(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine:
        q = await engine.prefill("hello world")
        messages = engine.stats().messages
        async with engine.stream(parents=[q], max_tokens=3, ignore_eos=True) as stream:
            async for _ in stream:
                while engine.stats().messages == messages:  # wait until the call finished
                    await anyio.sleep(0.005)
                break
        assert engine.stats().messages == messages  # nobody holds it: it was freed
        live = sum(m.slots for m in engine.messages())
        assert engine.stats().tokens_used == live


async def test_stream_never_yields_past_a_stop_string(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine:
        q = await engine.prefill("hello world")
        free_run = await engine.decode(parents=[q], max_tokens=24, ignore_eos=True)
        text = free_run.text
        stop = text[len(text) // 2 : len(text) // 2 + 3]
        assert stop and stop in text
        stream = engine.stream(parents=[q], max_tokens=24, ignore_eos=True, stop=stop)
        shown = ""
        async for delta in stream:
            shown += delta
            assert stop not in shown
        assert shown == stream.handle.text == text[: text.index(stop)]


async def test_stream_includes_the_header(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine:
        q = await engine.prefill("hello world")
        stream = engine.stream(parents=[q], header="the", max_tokens=6, ignore_eos=True)
        assert "".join([d async for d in stream]) == stream.handle.text
        assert stream.handle.text.startswith("the")


async def test_leaving_a_stream_early_returns_with_the_store_as_it_was(tiny_dirs):
    # found by the fuzz: the call was aborted at the loop's next step, after the block
    async with open_tiny(tiny_dirs, "llama") as engine:
        q = await engine.prefill("hello world")
        before = engine.stats()
        async with engine.stream(parents=[q], max_tokens=50, ignore_eos=True) as stream:
            async for _ in stream:
                break  # after the header's delta: the call is still running
        engine.check()  # idle now: nothing left to await
        after = engine.stats()
        assert (after.messages, after.tokens_used) == (before.messages, before.tokens_used)
        assert stream.handle is None


async def test_a_cancelled_decode_returns_with_the_store_as_it_was(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine:
        q = await engine.prefill("hello world")
        before = engine.stats()
        started = anyio.Event()

        async def decode():
            started.set()
            await engine.decode(parents=[q], max_tokens=200, ignore_eos=True)

        async with anyio.create_task_group() as tg:
            tg.start_soon(decode)
            await started.wait()
            for _ in range(20):  # let it be queued and run a step or more
                await anyio.lowlevel.checkpoint()
            tg.cancel_scope.cancel()
        engine.check()
        after = engine.stats()
        assert (after.messages, after.tokens_used) == (before.messages, before.tokens_used)


async def test_pieces_carry_their_tokens_and_logprobs(tiny_dirs):
    """`TextStream.pieces()`: the deltas with the tokens sampled since the last one and
    their log-probabilities; together, the handle's text, tokens and logprobs."""
    async with open_tiny(tiny_dirs, "llama") as engine:
        p = await engine.prefill("the quick brown fox")
        kw = dict(parents=[p], max_tokens=10, ignore_eos=True, logprobs=True, top_logprobs=2)
        stream = engine.stream(**kw)
        pieces = [x async for x in stream.pieces()]
        h = stream.handle
        assert "".join(x.text for x in pieces) == h.text
        assert [t for x in pieces for t in x.tokens] == list(h.generated)
        assert [v for x in pieces for v in x.logprobs] == list(h.logprobs)
        assert [t for x in pieces for t in x.top] == list(h.top_logprobs)
        plain = engine.stream(parents=[p], max_tokens=4, ignore_eos=True)
        assert all(not x.logprobs for x in [x async for x in plain.pieces()])
        engine.free(h)
        engine.free(plain.handle)
        engine.free(p)
        engine.check()
