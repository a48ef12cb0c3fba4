"""engine/exec/batch.py: a step plan laid out as rows; twin calls encoded once."""

from __future__ import annotations

from conftest import open_tiny


async def test_twin_calls_encode_their_shared_header_once(tiny_dirs):
    """Voters with the same parents and header encode the header once: the others copy
    its K/V (into their views and their own store slots) and share its logits. Each
    still decodes what it decodes alone, and a reader of its message sees the same
    as a reader of the same message decoded alone."""
    header = [5 + i for i in range(9)]
    kinds = [dict(), dict(temperature=1.3, seed=1), dict(temperature=1.3, seed=2), dict()]
    async with open_tiny(tiny_dirs, "llama") as engine:
        q = await engine.prefill("hello world, the quick brown fox")
        reqs = [dict(parents=[q], header=header, max_tokens=6, ignore_eos=True, **k) for k in kinds]
        alone = [await engine.decode(**r) for r in reqs]
        before = engine.stats()
        together = await engine.decode_many(reqs)
        after = engine.stats()
        assert [h.generated for h in together] == [h.generated for h in alone]
        feed = together[1].tokens_reused - together[0].tokens_reused  # role header + header
        assert feed > len(header) and together[0].tokens_reused == alone[0].tokens_reused
        for twin, solo in zip(together[1:], alone[1:], strict=True):
            assert twin.tokens_reused - solo.tokens_reused == feed
            assert solo.tokens_encoded - twin.tokens_encoded == feed
        encoded = after.tokens_encoded - before.tokens_encoded
        assert encoded == sum(h.tokens_encoded for h in together)  # the header once
        for twin, solo in zip(together[1:], alone[1:], strict=True):
            a = await engine.decode(parents=[q, twin], max_tokens=6, ignore_eos=True)
            b = await engine.decode(parents=[q, solo], max_tokens=6, ignore_eos=True)
            assert a.generated == b.generated
