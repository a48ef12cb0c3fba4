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
