"""patterns/cluster/dispatch.py: where a cluster runs each workflow."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corps.patterns.cluster.dispatch import Router, estimate_tokens, prompt_key


def test_least_loaded_in_tokens_not_in_workflows():
    r = Router(co_locate=0)
    r.add("a", 4)
    r.add("b", 4)
    r.start("a", "x", 1000)  # one long workflow
    r.start("b", "y", 10)
    r.start("b", "z", 10)  # two short ones weigh less
    assert r.choose("new") == "b"
    r.finish("a", 1000)
    assert r.choose("new") == "a" and r.load("a") == 0


def test_a_shared_prefix_goes_to_the_worker_that_ran_it_while_it_has_a_slot():
    doc = "A long shared document. " * 20
    r = Router(co_locate=128)
    r.add("a", 2)
    r.add("b", 2)
    r.start("a", doc + "question 1", 500)
    assert r.choose(doc + "question 2") == "a"  # a is busier, but holds the prefix
    assert r.choose("something else entirely") == "b"
    r.start("a", doc + "question 2", 500)  # a is now full
    assert r.choose(doc + "question 3") == "b"
    assert r.choose(doc + "question 3", wait=True) is None  # or it waits for a
    assert r.choose("unrelated", wait=True) == "b"


def test_no_free_slot_no_worker():
    r = Router()
    assert r.choose("x") is None
    r.add("a", 1)
    r.start("a", "x", 5)
    assert r.choose("y") is None
    r.remove("a")
    r.finish("a", 5)  # a removed worker's late finish is ignored
    assert r.workers == []
    with pytest.raises(ValueError):
        r.add("b", 0)


@settings(max_examples=200, deadline=None)
@given(
    slots=st.lists(st.integers(1, 3), min_size=1, max_size=4),
    ops=st.lists(
        st.tuples(st.booleans(), st.text("ab", max_size=6), st.integers(1, 50)), max_size=40
    ),
)
def test_choices_respect_slots_and_loads_return_to_zero(slots, ops):
    """Against a brute-force model: a chosen worker always has a free slot, None only
    when none has, and every finished workflow takes back exactly its tokens."""
    r = Router(co_locate=3)
    for i, n in enumerate(slots):
        r.add(f"w{i}", n)
    running: list[tuple[str, int]] = []
    for start, key, cost in ops:
        if start:
            w = r.choose(key, wait=False)
            free = [
                f"w{i}"
                for i, n in enumerate(slots)
                if sum(1 for x, _ in running if x == f"w{i}") < n
            ]
            assert (w is None) == (not free) and (w is None or w in free)
            if w is not None:
                r.start(w, key, cost)
                running.append((w, cost))
        elif running:
            w, c = running.pop(0)
            r.finish(w, c)
        for i in range(len(slots)):
            name = f"w{i}"
            assert r.load(name) == sum(c for x, c in running if x == name)
    for w, c in running:
        r.finish(w, c)
    assert all(r.load(w) == 0 and r.running(w) == 0 for w in r.workers)


def test_estimates():
    assert prompt_key({"question": "2+2?", "rounds": 3, "context": "maths"}) == "2+2?\nmaths"
    assert prompt_key({"questions": ["a", "b"], "more": {"x": ("c",)}, "n": 1}) == "a\nb\nc"
    assert estimate_tokens("x" * 400, 64) == 165
