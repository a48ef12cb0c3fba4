"""The radix prefix cache on its own (corps.cache.radix)."""

from __future__ import annotations

from corps.cache.radix import RadixCache


def test_longest_prefix_and_split():
    r = RadixCache()
    assert r.insert([1, 2, 3, 4], [10, 11, 12, 13]) == []
    m = r.match([1, 2, 9])
    assert (m.length, m.slots) == (2, [10, 11])
    assert r.root.children[1].key == [1, 2]  # split on divergence
    assert r.insert([1, 2, 9], [20, 21, 22]) == [20, 21]  # duplicates handed back
    assert r.match([1, 2, 9, 9]).slots == [10, 11, 22]
    assert r.match([1, 2, 3, 4, 5]).length == 4
    assert r.size == 5


def test_evicts_lru_unlocked_leaves_only():
    r = RadixCache()
    r.insert([1, 2, 3], [0, 1, 2])
    r.insert([1, 2, 4], [0, 1, 3])  # shares [1, 2]
    r.insert([7, 8], [4, 5])
    r.match([1, 2, 4])  # most recent
    locked = r.match([7, 8]).node
    r.lock(locked)
    assert sorted(r.evict(1)) == [2]  # the LRU unlocked leaf: [3]
    assert r.evict(10) == [3, 0, 1]  # then [4], then its parent [1, 2]
    assert r.match([7, 8]).length == 2  # the locked path survived
    r.unlock(locked)
    assert sorted(r.evict(10)) == [4, 5]
    assert r.size == 0


def test_hit_rate_counts_tokens():
    r = RadixCache()
    r.match([1, 2, 3])
    r.insert([1, 2, 3], [0, 1, 2])
    r.match([1, 2, 3, 4])
    assert (r.hit_tokens, r.query_tokens) == (3, 7)


def test_peek_changes_nothing_and_match_can_skip_the_counters():
    r = RadixCache()
    r.insert([1, 2, 3, 4], [0, 1, 2, 3], creator=7)
    assert r.peek([1, 2, 9]) == 2 and r.root.children[1].key == [1, 2, 3, 4]  # no split
    assert r.peek([1, 2, 3, 4, 5]) == 4 and r.peek([9]) == 0
    m = r.match([1, 2, 3], count=False)
    assert m.creators == ((7, 3),) and (r.hit_tokens, r.query_tokens) == (0, 0)


def test_drop_takes_back_only_a_creators_free_leaves():
    r = RadixCache()
    r.insert([1, 2, 3], [0, 1, 2], creator=1)
    r.insert([1, 2, 4], [0, 1, 3], creator=2)  # splits [1, 2] off creator 1's edge
    assert r.drop(1) == [2] and r.holds(1)  # [1, 2] is shared with creator 2's leaf
    lock = r.match([1, 2, 4]).node
    r.lock(lock)
    assert r.drop(2) == [] and r.drop(1) == []  # locked: a running call reads it
    r.unlock(lock)
    assert r.drop(2) == [3] and r.drop(1) == [0, 1] and r.size == 0 and not r.holds(1)


def test_a_salt_keeps_trees_apart():
    """What one salt cached is never matched under another (nor unsalted), each salt's
    tree evicts like the rest, and an emptied salted tree is forgotten."""
    r = RadixCache()
    r.insert([1, 2, 3], [10, 11, 12], salt="a")
    assert r.match([1, 2, 3], salt="b").length == 0
    assert r.match([1, 2, 3]).length == 0 and r.peek([1, 2, 3], "b") == 0
    assert r.match([1, 2, 3], salt="a").slots == [10, 11, 12]
    assert r.insert([1, 2, 3], [20, 21, 22], salt="b") == []  # not a duplicate: b's own
    assert sorted(r.check_idle()) == [10, 11, 12, 20, 21, 22] and r.size == 6
    assert sorted(r.evict(6)) == [10, 11, 12, 20, 21, 22]
    assert set(r.roots) == {None}
    r.insert([5], [30], creator=7, salt="c")
    assert r.drop(7) == [30] and set(r.roots) == {None}
