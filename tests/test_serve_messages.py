"""serve/messages.py: the server's kept messages, bounded in count and in the store's
slots (least recently used freed first, never one a request still claims), and a
failed request's new messages freed."""

from __future__ import annotations

from corps.engine import Engine
from corps.serve.messages import MessageCache


async def test_kept_messages_stay_within_their_share_of_the_store():
    async with Engine.open("dummy:tiny") as engine:
        cache = MessageCache(engine, size=1000, tokens=60)
        handles = []
        for i in range(12):
            h, found = await cache.encode("user", f"message number {i} " * 3, [], [None],
                                          "t/", "t")  # fmt: skip
            assert not found
            cache.release([h], ok=True)
            handles.append(h)
            assert cache.tokens() <= 60
        assert handles[0].freed and not handles[-1].freed  # least recently used went first
        claimed, _ = await cache.encode("user", "held by a request " * 20, [], [None], "t/", "t")
        assert not claimed.freed and cache.tokens() > 60  # claimed: kept past the bound
        cache.release([claimed], ok=True)
        assert cache.tokens() <= 60
        engine.check()


async def test_a_failed_requests_new_message_is_freed_and_counted_out():
    async with Engine.open("dummy:tiny") as engine:
        cache = MessageCache(engine, size=10, tokens=10_000)
        h, _ = await cache.encode("user", "a prompt that fails", [], [None], "t/", "t")
        assert cache.tokens() == h.length
        cache.release([h], ok=False)
        assert h.freed and cache.tokens() == 0 and len(cache) == 0
        engine.check()
