"""The public async Engine API (corps.engine.engine) and baseline mode end to end."""

from __future__ import annotations

from corps.cache.handle import Handle

from conftest import open_tiny


async def test_documented_api_shape(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine:
        sys = await engine.prefill("You are a careful solver.", role="system")
        q = await engine.prefill("What is 7*6?", role="user", parents=[sys])
        ans = await engine.decode(
            parents=[sys, q], role="assistant", header="", max_tokens=8, temperature=0.0
        )
        assert isinstance(ans, Handle) and ans.parents == (sys, q)
        assert ans.role == "assistant" and ans.offset == sys.length + q.length
        assert ans.length == len(ans.tokens) and isinstance(ans.text, str)
        many = await engine.decode_many(
            [dict(parents=[sys, q], max_tokens=6, seed=i, temperature=1.0) for i in range(4)]
        )
        assert len(many) == 4 and len({h.id for h in many}) == 4
        assert (
            engine.tokenizer is engine._core.tokenizer
            and (engine.model_path / "config.json").exists()
        )
        stats = engine.stats()
        assert stats.messages == 7 and stats.tokens_reused > 0


async def test_seeded_sampling_is_reproducible(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine:
        q = await engine.prefill("hello world")
        kw = dict(parents=[q], max_tokens=12, temperature=1.5, top_p=0.9, top_k=50, ignore_eos=True)
        a = await engine.decode(seed=7, **kw)
        b = await engine.decode(seed=7, **kw)
        others = await engine.decode_many([dict(seed=s, **kw) for s in (1, 7, 3)])
        assert a.tokens == b.tokens == others[1].tokens


async def test_stop_strings_and_raw_header(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine:
        q = await engine.prefill("the quick brown fox")
        free = await engine.decode(parents=[q], max_tokens=20, ignore_eos=True)
        assert len(free.text) > 2
        stop = free.text[1:3]
        cut = await engine.decode(parents=[q], max_tokens=20, ignore_eos=True, stop=[stop])
        assert stop not in cut.text and free.text.startswith(cut.text)
        raw = await engine.decode(parents=[q], frame=False, header=[5, 6], max_tokens=3)
        assert raw.tokens[:2] == [5, 6]


async def test_stream_yields_the_text(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine:
        q = await engine.prefill("hello world")
        stream = engine.stream(parents=[q], max_tokens=10, ignore_eos=True)
        deltas = [d async for d in stream]
        assert "".join(deltas) == stream.handle.text


async def test_baseline_multi_turn_reencodes_only_the_new_turn(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama", mode="baseline") as engine:
        sys = await engine.prefill("you are a careful solver", role="system")
        u1 = await engine.prefill("what is seven times six", parents=[sys])
        a1 = await engine.decode(parents=[sys, u1], max_tokens=6, ignore_eos=True)
        u2 = await engine.prefill("hello world", parents=[sys, u1, a1])
        before = engine.stats()
        a2 = await engine.decode(parents=[sys, u1, a1, u2], max_tokens=6, ignore_eos=True)
        after = engine.stats()
        header = len(a2.tokens) - 6
        assert after.tokens_encoded - before.tokens_encoded == u2.length + header + 6
        assert (
            after.prefix_hit_tokens - before.prefix_hit_tokens == sys.length + u1.length + a1.length
        )
        assert 0 < after.prefix_hit_rate < 1


async def test_baseline_evicts_under_pressure_and_keeps_working(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama", mode="baseline", capacity=120) as engine:
        for i in range(8):
            q = await engine.prefill(f"hello world number {i} " * 3)
            await engine.decode(parents=[q], max_tokens=8, ignore_eos=True)
        assert engine.stats().tokens_used <= 120
