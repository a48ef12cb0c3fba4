"""The view arena (corps.cache.arena) and the batched decode path that uses it."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corps.cache.arena import ViewArena
from corps.engine.exec.call import Call
from corps.engine.request.requests import DecodeRequest, PrefillRequest
from corps.engine.request.sampling_params import SamplingParams

from conftest import open_tiny
from helpers import order, run_calls


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


def test_calls_that_do_not_fit_the_arena_wait_for_it_and_agree(tiny_dirs):
    reqs = None
    outputs = []
    for capacity in (4096, 40):  # the small arena holds some views, not all
        core = open_tiny(tiny_dirs, "llama").executor
        core.memory.arena = ViewArena(
            num_layers=2,
            num_kv_heads=2,
            head_dim=16,
            capacity=capacity,
            dtype=core.memory.store.k.dtype,
        )
        hs, _ = run_calls(
            core, [PrefillRequest(p) for p in ("hello world", "the quick fox", "what is seven")]
        )
        sp = SamplingParams(max_tokens=9, ignore_eos=True)
        reqs = [DecodeRequest(parents=[h], sampling=sp) for h in hs]
        outputs.append([h.tokens for h in run_calls(core, reqs)[0]])
        assert core.memory.arena.free_tokens == capacity  # every view gave its range back
    assert outputs[0] == outputs[1]


def test_a_failed_gather_gives_its_arena_range_back():
    import pytest
    import torch

    from corps.cache.arena import ViewArena
    from corps.cache.kv import KVStore
    from corps.cache.rope import RopeTables
    from corps.engine.attention.views import open_view

    dims = dict(
        num_layers=1, num_kv_heads=1, head_dim=4, capacity=16, dtype=torch.float32, device="cpu"
    )
    store, arena = KVStore(**dims), ViewArena(**dims)

    def broken(*args):
        raise RuntimeError("rotation failed")

    rope = RopeTables(torch.ones(16, 4), torch.zeros(16, 4))
    slots = torch.tensor([0, 1])
    with pytest.raises(RuntimeError):
        open_view(store, rope, slots, slots, 4, arena, fill=broken)
    assert arena.alloc(16) == 0  # the whole arena is free again


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("admit"), st.integers(0, 7), st.booleans(), st.integers(1, 8)),
            st.tuples(st.just("admit"), st.integers(0, 7), st.booleans(), st.integers(1, 8)),
            st.tuples(st.just("step"), st.integers(1, 64), st.integers(1, 24)),
            st.tuples(st.just("cancel"), st.integers(0, 15)),
            st.tuples(st.just("finish")),
            st.tuples(st.just("finish")),
            st.tuples(st.just("free"), st.integers(0, 15)),
        ),
        min_size=8,
        max_size=60,
    )
)
def test_budget_holds_under_random_admissions_steps_cancels_and_frees(tiny_dirs, ops):
    """A model of the budget: the store holds exactly the live messages plus what every
    running call reserved up front (its feed, and every token it may generate); every
    view token sits in the arena (nothing spills); a call refused for memory changes
    nothing; and once all is cancelled and freed, nothing has leaked."""
    from corps.cache.errors import CacheFullError

    engine = open_tiny(tiny_dirs, "llama", capacity=96)
    core = engine.executor
    roots = [run_calls(core, [PrefillRequest(t)])[0][0] for t in ("hello world", "the fox")]
    messages, running = list(roots), []
    made = {}  # calls the steps finished -> their handles

    def check() -> None:
        live = sum(len(m.slots) for m in core.table.all() if not m.freed or m.pins)
        held = sum(len(c.slots) + len(c.spare) for c in running)
        assert core.memory.store.used_slots == live + held
        for c in running:
            if not c.done:  # reserved up front: never runs out mid-generation
                reserved = len(c.feed) + c.plan.sampling.max_tokens + len(c.plan.footer)
                assert len(c.slots) + len(c.spare) == reserved
        arena = core.memory.arena
        assert arena.capacity - arena.free_tokens == core.stats().view_tokens <= arena.capacity

    for op in ops:
        if op[0] == "admit":
            parents = [h for i, h in enumerate(roots + messages[2:]) if op[1] >> (i % 3) & 1]
            parents = [p for p in dict.fromkeys(parents) if not core.table.get(p.id).freed]
            offsets = None if op[2] else [3 * i for i in range(len(parents))]
            req = DecodeRequest(
                parents=parents[:3],
                offsets=offsets[:3] if offsets else None,
                sampling=SamplingParams(max_tokens=op[3], ignore_eos=True),
            )
            before = (
                core.memory.store.used_slots,
                core.memory.arena.free_tokens,
                core.stats().view_tokens,
            )
            try:
                running.append(core.admit(Call(request=req)))
            except CacheFullError:
                assert (
                    core.memory.store.used_slots,
                    core.memory.arena.free_tokens,
                    core.stats().view_tokens,
                ) == before
        elif op[0] == "step":
            for _ in range(op[2]):
                live = [c for c in running if not c.done]
                if live:
                    out = core.step(order(live, op[1]))
                    assert not out.failed
                    made.update(out.finished)
                    check()  # done calls hold no view or spare slots, before finish too
        elif op[0] == "cancel" and running:
            c = running.pop(op[1] % len(running))
            if c in made:  # finished already: its message is freed instead
                core.free(made.pop(c))
            else:
                core.abort(c)
        elif op[0] == "finish":
            messages += [made.pop(c) for c in running if c.done]
            running = [c for c in running if not c.done]
        elif op[0] == "free" and len(messages) > 2:
            h = messages[2 + op[1] % (len(messages) - 2)]
            if not core.table.get(h.id).freed:
                core.free(h)
        check()
    for c in running:
        core.abort(c)
    for h in [*messages, *made.values()]:
        if not core.table.get(h.id).freed:
            core.free(h)
    engine.check()


def test_a_new_arena_holds_zeros_so_a_masked_key_cannot_make_a_row_nan():
    """FlexAttention reads a window of the arena and masks what a row may not see;
    weight 0 times a never-written value that is NaN is NaN. torch.empty's memory
    can hold anything (in CI it did, now and then: tokens 0 out of a flex batch)."""
    import torch

    arena = ViewArena(num_layers=2, num_kv_heads=2, head_dim=4, capacity=64, dtype=torch.float32)
    assert torch.count_nonzero(arena.k) == 0 and torch.count_nonzero(arena.v) == 0
    weights = torch.tensor([[1.0, 0.0]])  # the second key masked
    assert torch.isnan(weights @ torch.tensor([[1.0], [float("nan")]])).all()
