"""engine/attention/views.py: building a call's view; contexts read from the store."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corps.cache.arena import ViewArena
from corps.cache.context import ContextPool
from corps.cache.errors import ViewsFull
from corps.cache.kv import KVStore
from corps.cache.rope import RopeTables
from corps.cache.view import CallView
from corps.engine.attention.views import StoreContext, open_view
from corps.engine.errors import InvalidRequest
from corps.engine.kernels.gather_rotate import gather_rotated
from corps.engine.request.requests import DecodeRequest, PrefillRequest
from corps.engine.request.sampling_params import SamplingParams

from conftest import open_tiny
from helpers import run_calls

L, HKV, D, S = 3, 2, 8, 64


def _store(seed: int = 0) -> tuple[KVStore, RopeTables]:
    """A random store of L layers and S slots, and RoPE tables for 128 positions."""
    g = torch.Generator().manual_seed(seed)
    store = KVStore(num_layers=L, num_kv_heads=HKV, head_dim=D, capacity=S, dtype=torch.float32)
    store.k.copy_(torch.randn(store.k.shape, generator=g))
    store.v.copy_(torch.randn(store.v.shape, generator=g))
    angles = torch.arange(128.0)[:, None] * torch.rand(D // 2, generator=g)[None]  # (P, D/2)
    rope = RopeTables(angles.cos().repeat(1, 2), angles.sin().repeat(1, 2))
    return store, rope


def _scratch(capacity: int = S) -> ViewArena:
    return ViewArena(
        num_layers=1, num_kv_heads=HKV, head_dim=D, capacity=capacity, dtype=torch.float32
    )


@st.composite
def contexts(draw):
    """Slots (one run, or any distinct slots in any order) and positions for them."""
    c = draw(st.integers(1, 24))
    if draw(st.booleans()):
        first = draw(st.integers(0, S - c))
        slots = list(range(first, first + c))
    else:
        slots = draw(st.permutations(range(S)))[:c]
    positions = draw(st.lists(st.integers(0, 127), min_size=c, max_size=c))
    return slots, positions


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, ignore_eos=True)


@settings(max_examples=60, deadline=None)
@given(ctx=contexts(), layers=st.lists(st.integers(0, L - 1), min_size=1, max_size=6))
def test_a_context_read_from_the_store_is_the_copy_bit_for_bit(ctx, layers):
    """Every layer, asked in any order and more than once, gives exactly the rotated
    keys and the values a copy in the view arena holds."""
    slots, positions = ctx
    store, rope = _store()
    s, p = torch.tensor(slots), torch.tensor(positions)
    want_k = torch.empty(L, HKV, len(slots), D)
    want_v = torch.empty_like(want_k)
    gather_rotated(store.k, store.v, s, p, rope, want_k, want_v)
    sc = _scratch()
    got = StoreContext(None, store, rope, s, p, sc)
    assert (got.first is not None) == (slots == list(range(slots[0], slots[0] + len(slots))))
    for layer in layers:
        k, v = got.layer(layer)
        assert torch.equal(k, want_k[layer]) and torch.equal(v, want_v[layer])
    assert sc.free_tokens == S - len(slots)
    got.free()
    got.free()  # idempotent
    assert sc.free_tokens == S


def test_contexts_read_from_the_store_are_shared_and_hold_only_their_scratch():
    """Views with the same (slots, positions) share one store context; its scratch goes
    back with the last reader, it holds nothing in the view arena, and a context that
    does not fit the scratch raises ViewsFull, taking nothing."""
    store, rope = _store()
    arena = ViewArena(num_layers=L, num_kv_heads=HKV, head_dim=D, capacity=32, dtype=torch.float32)
    sc, pool = _scratch(16), ContextPool()
    slots, pos = [5, 6, 7, 9], [0, 1, 2, 3]
    a = open_view(store, rope, slots, pos, 4, arena, pool=pool, scratch=sc)
    b = open_view(store, rope, slots, pos, 6, arena, pool=pool, scratch=sc)
    assert a.ctx is b.ctx and a.ctx.in_store and a.ctx.refs == 2
    assert not a.contiguous and a.arena is None and a.batch_arena is arena
    assert (pool.tokens, sc.free_tokens, arena.free_tokens) == (0, 12, 32 - 10)
    with pytest.raises(ViewsFull):
        open_view(store, rope, list(range(20, 33)), list(range(13)), 2, arena, pool=pool,
                        scratch=sc)  # fmt: skip
    assert (len(pool), sc.free_tokens, arena.free_tokens) == (1, 12, 22)
    a.release()
    assert sc.free_tokens == 12 and len(pool) == 1
    b.release()
    b.release()  # idempotent
    assert (len(pool), sc.free_tokens, arena.free_tokens) == (0, 16, 32)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 6), st.booleans()), max_size=30))
def test_scratch_and_arena_are_never_leaked(ops):
    """Random gathers and releases over a few contexts: the pool's readers, the
    scratch and the arena agree with a model of what is live."""
    store, rope = _store()
    arena = ViewArena(num_layers=L, num_kv_heads=HKV, head_dim=D, capacity=40, dtype=torch.float32)
    sc, pool = _scratch(24), ContextPool()
    keys = [([1, 2, 3], [0, 1, 2]), ([1, 2, 3], [4, 5, 6]), ([8, 3, 30, 2, 9], [0, 1, 2, 3, 4]),
            ([40, 41, 42, 43, 44, 45, 46, 47], list(range(8)))]  # fmt: skip
    live: list[CallView] = []
    for which, extra, release in ops:
        if release and live:
            live.pop(extra % len(live)).release()
        else:
            try:
                live.append(open_view(store, rope, *keys[which], extra, arena, pool=pool,
                                            scratch=sc))  # fmt: skip
            except ViewsFull:
                pass
        ctxs = {id(v.ctx): v.ctx for v in live}
        assert len(pool) == len(ctxs)
        assert sc.free_tokens == 24 - sum(c.length for c in ctxs.values())
        assert arena.free_tokens == 40 - sum(v.capacity for v in live)
    for v in live:
        v.release()
    assert (len(pool), sc.free_tokens, arena.free_tokens) == (0, 24, 40)


def test_store_contexts_need_the_torch_backend_and_a_known_name(tiny_dirs, monkeypatch):
    with pytest.raises(InvalidRequest, match="contexts must be one of"):
        open_tiny(tiny_dirs, contexts="shared")
    monkeypatch.setenv("CORPS_ATTENTION", "flex")
    with pytest.raises(InvalidRequest, match="torch attention backend"):
        open_tiny(tiny_dirs, contexts="store")


def test_store_contexts_decode_like_copies_with_less_memory(tiny_dirs):
    """The same workload, contexts copied or read from the store: the same tokens;
    with "store" the views hold only calls' own tokens, and the scratch one layer."""
    runs = {}
    for contexts in ("copy", "store"):
        engine = open_tiny(tiny_dirs, "qwen3", contexts=contexts)
        core = engine.executor
        texts = ("you are a careful solver", "what is seven times six")
        (a, b), _ = run_calls(core, [PrefillRequest(t) for t in texts])
        reqs = [
            DecodeRequest(parents=[a, b], header=h, sampling=greedy(n))
            for h, n in (("so", 6), ("the", 9), ("it", 4))
        ]
        out = run_calls(core, reqs)[0]
        stats = engine.stats()
        runs[contexts] = ([h.tokens for h in out], stats, a.length + b.length)
    (copy_tokens, copy, ctx), (store_tokens, store, _) = runs["copy"], runs["store"]
    assert store_tokens == copy_tokens
    assert store.contexts == "store" and copy.contexts == "copy"
    assert copy.view_tokens_peak - store.view_tokens_peak == ctx
    assert (store.scratch_tokens_peak, copy.scratch_tokens_peak) == (ctx, 0)
    assert store.kv_bytes > copy.kv_bytes  # the one-layer scratch, within the same capacity
