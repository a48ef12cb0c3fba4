"""Visibility, provenance and leak policies (corps.cache.visibility, corps.engine.api.access)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corps.cache import AccessDenied, LeakageError, Private, Public, Shared
from corps.cache.visibility import LeakWarning
from corps.engine.api.access import hidden_sources
from corps.engine.request.requests import PrefillRequest

from conftest import open_tiny
from helpers import run_calls

AGENTS = ["alice", "bob", "carol"]


def test_visibility_rules():
    assert Public().allows("bob", "alice")
    assert not Private().allows("bob", "alice") and Private().allows("alice", "alice")
    shared = Shared({"bob"})
    assert shared.allows("bob", "alice") and shared.allows("alice", "alice")
    assert not shared.allows("carol", "alice")
    assert Private().allows(None, "alice")  # the engine's own caller sees everything


@st.composite
def worlds(draw):
    """Random messages: owner, visibility, and parents among earlier messages it may see."""
    msgs = []
    for i in range(draw(st.integers(2, 8))):
        owner = draw(st.sampled_from(AGENTS))
        vis = draw(st.sampled_from(["public", "private", "shared"]))
        readers = draw(st.sets(st.sampled_from(AGENTS))) if vis == "shared" else set()
        candidates = list(range(i))
        parents = draw(st.lists(st.sampled_from(candidates), unique=True)) if candidates else []
        msgs.append((owner, vis, readers, parents))
    reader = draw(st.sampled_from(AGENTS))
    return msgs, reader


def _vis(kind, readers):
    return {"public": Public(), "private": Private(), "shared": Shared(readers)}[kind]


def oracle_hidden(msgs, reader, mid) -> set[int]:
    """Brute force: every message reachable from mid's parents, that reader cannot see."""
    seen, stack = set(), list(msgs[mid][3])
    while stack:
        m = stack.pop()
        if m not in seen:
            seen.add(m)
            stack.extend(msgs[m][3])
    return {m for m in seen if not _vis(msgs[m][1], msgs[m][2]).allows(reader, msgs[m][0])}


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(world=worlds())
def test_leak_detector_matches_reachability_oracle(tiny_dirs, world):
    msgs, reader = world
    core = open_tiny(tiny_dirs, "llama").executor
    handles = []
    for owner, vis, readers, parents in msgs:
        req = PrefillRequest(
            [5, 6],
            frame=False,
            parents=[handles[p] for p in parents],
            owner=owner,
            visibility=_vis(vis, readers),
        )
        (h,), _ = run_calls(core, [req])
        handles.append(h)
    for mid, h in enumerate(handles):
        want = {handles[m].id for m in oracle_hidden(msgs, reader, mid)}
        assert hidden_sources(core.table, reader, h.id) == want


async def _alice_and_bob(engine):
    secret = await engine.prefill("always defect", owner="alice", visibility=Private())
    public = await engine.prefill(
        "hello world", parents=[secret], owner="alice", visibility=Public()
    )
    return secret, public


async def test_access_denied_changes_nothing(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine:
        secret, _ = await _alice_and_bob(engine)
        before = (engine.stats(), len(engine.messages()))
        with pytest.raises(AccessDenied, match="bob cannot read"):
            await engine.decode(parents=[secret], owner="bob", max_tokens=3)
        with pytest.raises(AccessDenied):
            engine.read(secret, reader="bob")
        assert (engine.stats(), len(engine.messages())) == before
        assert engine.read(secret, reader="alice") == "always defect"


async def test_warn_and_allow_record_leaks(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine:
        secret, public = await _alice_and_bob(engine)
        with pytest.warns(LeakWarning, match="bob cannot see"):
            await engine.decode(parents=[public], owner="bob", max_tokens=3)
        await engine.decode(parents=[public], owner="bob", max_tokens=3, leak_policy="allow")
        leaks = engine.leaks()
        assert len(leaks) == 2 and leaks[0].reader == "bob" and leaks[0].parent == public.id
        assert leaks[0].sources == {secret.id} and "bob" in leaks[0].call
        assert [e.kind for e in engine.access_events()] == ["leak", "leak"]
        assert not hasattr(engine, "trace")  # the old name of audit(), gone


async def test_deny_raises_before_any_computation(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama", leak_policy="deny") as engine:
        _, public = await _alice_and_bob(engine)
        before = engine.stats()
        with pytest.raises(LeakageError, match=r"decode by bob .*alice's user") as refused:
            await engine.decode(parents=[public], owner="bob", max_tokens=3)
        assert "defect" not in str(refused.value)  # names the secret, never quotes it
        assert engine.stats() == before and engine.leaks() == []


async def test_reencode_equals_encoding_with_only_visible_context(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama", leak_policy="reencode") as engine:
        core = engine.executor
        intro = await engine.prefill("you are a careful solver", owner="carol")
        secret = await engine.prefill("always defect", owner="alice", visibility=Private())
        public = await engine.prefill("hello world", parents=[intro, secret], owner="alice")
        ans = await engine.decode(parents=[public], owner="bob", max_tokens=3)
        assert engine.leaks() == [] and [e.kind for e in engine.access_events()] == ["reencode"]
        (view_id,) = ans._msg.parents
        view = core.table.get(view_id)
        assert view.view_of == public.id and view.text == public.text
        assert hidden_sources(core.table, "bob", ans.id) == frozenset()
        # the view's encoding equals encoding the text with only bob-visible context
        manual = await engine.prefill(
            public.tokens, frame=False, parents=[intro], offsets=[0], new_offset=public.offset
        )
        k_view = core.memory.store.k[:, view.slots]
        k_manual = core.memory.store.k[:, core.table.get(manual.id).slots]
        assert torch.allclose(k_view, k_manual, atol=1e-6)
        again = await engine.decode(parents=[public], owner="bob", max_tokens=3)
        assert again._msg.parents == (view_id,)  # the view is cached for bob


async def test_baseline_mode_reports_no_leaks(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama", mode="baseline", leak_policy="deny") as engine:
        _, public = await _alice_and_bob(engine)
        await engine.decode(parents=[public], owner="bob", max_tokens=3)
        assert engine.leaks() == []
