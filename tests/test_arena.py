"""The view arena (corps.cache.arena) and the batched decode path that uses it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from corps.cache.arena import ViewArena
from corps.engine.requests import DecodeRequest, PrefillRequest
from corps.engine.sampling import SamplingParams

from conftest import open_tiny


def arena(capacity: int) -> ViewArena:
    return ViewArena(num_layers=1, num_kv_heads=1, head_dim=2, capacity=capacity, dtype=None)


@given(st.lists(st.tuples(st.booleans(), st.integers(1, 12)), max_size=60))
def test_ranges_never_overlap_and_free_space_is_exact(ops):
    a = arena(64)
    used = [False] * 64  # brute-force occupancy
    held: list[tuple[int, int]] = []
    for do_alloc, n in ops:
        if do_alloc or not held:
            start = a.alloc(n)
            fits = any(not any(used[s : s + n]) for s in range(64 - n + 1))
            if start is None:
                assert not fits  # first fit misses nothing that contiguous space would give
                continue
            assert not any(used[start : start + n])
            used[start : start + n] = [True] * n
            held.append((start, n))
        else:
            start, n = held.pop(n % len(held))
            a.release(start, n)
            used[start : start + n] = [False] * n
        assert a.free_tokens == used.count(False)
    for start, n in held:
        a.release(start, n)
    assert a._free == [(0, 64)]  # everything merged back


def test_calls_that_do_not_fit_fall_back_and_agree(tiny_dirs):
    reqs = None
    outputs = []
    for capacity in (4096, 40):  # the small arena holds some views, not all
        core = open_tiny(tiny_dirs, "llama")._core
        core.arena = ViewArena(
            num_layers=2, num_kv_heads=2, head_dim=16, capacity=capacity, dtype=core.store.k.dtype
        )
        hs, _ = core.prefill_many(
            [PrefillRequest(p) for p in ("hello world", "the quick fox", "what is seven")]
        )
        sp = SamplingParams(max_tokens=9, ignore_eos=True)
        reqs = [DecodeRequest(parents=[h], sampling=sp) for h in hs]
        outputs.append([h.tokens for h in core.decode_many(reqs)])
        assert core.arena.free_tokens == capacity  # every view gave its range back
    assert outputs[0] == outputs[1]


def test_a_failed_gather_gives_its_arena_range_back():
    import pytest
    import torch

    from corps.cache.arena import ViewArena
    from corps.cache.kv import KVStore
    from corps.cache.view import CallView

    dims = dict(
        num_layers=1, num_kv_heads=1, head_dim=4, capacity=16, dtype=torch.float32, device="cpu"
    )
    store, arena = KVStore(**dims), ViewArena(**dims)

    class Broken:
        def rotate(self, x, positions):
            raise RuntimeError("rotation failed")

    slots = torch.tensor([0, 1])
    with pytest.raises(RuntimeError):
        CallView.gather(store, Broken(), slots, slots, 4, arena)
    assert arena.alloc(16) == 0  # the whole arena is free again
