"""engine/exec/hf.py: the hf mode, transformers generate one call at a time."""

from __future__ import annotations

import pytest

from corps.cache import InvalidRequest

from conftest import open_tiny


async def test_forced_decode_replays_another_runs_tokens(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama", mode="baseline") as engine:
        q = await engine.prefill("hello world")
        ref = await engine.decode(parents=[q], max_tokens=8, temperature=1.0, seed=3)
    async with open_tiny(tiny_dirs, "llama") as engine:
        q = await engine.prefill("hello world")
        got = await engine.decode(parents=[q], force=ref.generated)
        assert got.generated == ref.generated and got.text == ref.text
        assert got.tokens_encoded == got.length  # it really decoded, token by token
        with pytest.raises(InvalidRequest, match="vocabulary"):
            await engine.decode(parents=[q], force=[10**6])
    async with open_tiny(tiny_dirs, "llama", mode="hf") as engine:  # transformers generate
        q = await engine.prefill("hello world")
        got = await engine.decode(parents=[q], force=ref.generated)
        assert got.generated == ref.generated and got.tokens == ref.tokens
        assert got.ttft is not None and got.ttft > 0
        free = await engine.decode(parents=[q], max_tokens=8, ignore_eos=True)
        assert len(free.generated) == 8 and engine.stats().tokens_reused == 0


@pytest.mark.parametrize("mode", ["choreographed", "baseline", "hf"])
async def test_logit_bias_bans_and_forces_a_token_in_every_mode(tiny_dirs, mode):
    """The same greedy decode with its first token banned (-100) never emits it, and a
    +100 bias makes another token the first, in the corps engines and under generate."""
    async with open_tiny(tiny_dirs, "llama", mode=mode) as engine:
        q = await engine.prefill("what is seven times six")

        async def first(**bias):
            h = await engine.decode(parents=[q], max_tokens=3, temperature=0, **bias)
            return h.generated[0]

        top = await first()
        assert await first(logit_bias={top: -100}) != top
        assert await first(logit_bias={(top + 7) % 300: 100}) == (top + 7) % 300
