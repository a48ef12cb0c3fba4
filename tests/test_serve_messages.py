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


async def test_with_a_store_ids_come_back_for_their_tenant_only(tmp_path):
    """A server's kept messages outlive it on a store: each id names its message
    again, for its tenant alone, and is found again by content; a request that never
    succeeded leaves nothing behind."""
    store = tmp_path / "store"
    async with Engine.open("dummy:tiny", store=store) as engine:
        cache = MessageCache(engine, size=10, tokens=10_000)
        a, _ = await cache.encode("user", "tenant a's prompt", [], [None], "a/", "a")
        b, _ = await cache.encode("user", "tenant b's prompt", [], [None], "b/", "b")
        lost, _ = await cache.encode("user", "a prompt that fails", [], [None], "a/", "a")
        cache.release([a, b], ok=True)
        ids = cache.public_id(a), cache.public_id(b)
        cache.close()  # the server stops, its request still claiming `lost`
        assert lost.freed and not a.freed
    async with Engine.open("dummy:tiny", store=store) as engine:
        cache = MessageCache(engine, size=10, tokens=10_000)
        assert cache.restore() == 2
        assert cache.find("a", ids[0]).id == a.id and cache.find("b", ids[1]).id == b.id
        assert cache.find("b", ids[0]) is None and cache.find("a", ids[1]) is None
        again, found = await cache.encode("user", "tenant a's prompt", [], [None], "a/", "a")
        assert found and again.id == a.id
        engine.check()
