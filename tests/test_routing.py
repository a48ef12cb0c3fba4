"""engine/attention/routing.py: which rows of a step attend through one batched plan."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("capped", [False, True])
async def test_short_headers_over_a_shared_context_batch_and_match_each_call_alone(
    tiny_dirs, monkeypatch, capped
):
    """Voters' headers over one shared context go through one batched plan (spans of
    several rows), beside a decode and a long prompt in the same steps, unless their
    padded scores would pass the cap; every call decodes what it decodes alone."""
    from functools import partial

    import anyio

    from corps.engine.attention import SdpaAttention

    from conftest import open_tiny

    spans_batched = []
    real = SdpaAttention.attend_decode

    def spy(self, layer, q, k, v, plan, scale):
        if layer == 0 and plan.t > 1:
            spans_batched.append(plan.t)
        return real(self, layer, q, k, v, plan, scale)

    monkeypatch.setattr(SdpaAttention, "attend_decode", spy)
    if capped:
        monkeypatch.setattr("corps.engine.attention.routing.SHORT_SPAN_PAIRS", 0)
    async with open_tiny(tiny_dirs, "qwen3") as engine:
        ctx = await engine.prefill_many([dict(message=f"branch {i} " * 9) for i in range(4)])
        votes = [
            dict(parents=ctx, header=f"{i}" * (i + 2), max_tokens=5, ignore_eos=True)
            for i in range(4)
        ]
        long = dict(message="a long prompt " * 60)
        alone = [(await engine.decode(**kw)).tokens for kw in votes]
        assert not spans_batched  # one call at a time: nothing to batch
        together = {}

        async def vote(i: int) -> None:
            together[i] = (await engine.decode(**votes[i])).tokens

        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(engine.prefill, **long))
            for i in range(4):
                tg.start_soon(vote, i)
    assert bool(spans_batched) != capped  # the headers went through the batched plan
    assert [together[i] for i in range(4)] == alone
