"""Handles bound to a reader (corps.cache.handle): reading what one cannot see fails."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict

from corps.agents import Agent, Runtime
from corps.cache import AccessDenied, Handle, Private
from corps.cache.handle import bind
from corps.cache.messages import MessageTable

from conftest import open_tiny


class Bundle(BaseModel):  # handles in a payload need no model_config
    model_config = ConfigDict(frozen=True)
    items: tuple[Handle, ...]
    main: Handle
    extra: Handle | None = None


async def _secret_and_remark(engine):
    secret = await engine.prefill("always defect", owner="alice", visibility=Private())
    remark = await engine.prefill("hello world", parents=[secret], owner="alice")
    return secret, remark


async def test_bound_handles_check_access_on_every_walk(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine:
        _, remark = await _secret_and_remark(engine)
        assert remark.reader == "alice"  # a call made as alice returns alice's handle
        as_bob = bind(remark, "bob")
        assert as_bob.text == "hello world" and as_bob == remark
        (parent,) = as_bob.parents
        with pytest.raises(AccessDenied, match="bob cannot read"):
            _ = parent.text
        with pytest.raises(AccessDenied):
            _ = parent.tokens
        assert all(s.reader == "bob" for s in as_bob.sources)
        with pytest.raises(AccessDenied):
            _ = [s.text for s in as_bob.sources]
        assert "hidden from bob" in repr(parent)
        assert bind(remark, None).parents[0].text == "always defect"  # the engine's caller


def test_bind_reaches_into_payloads():
    table = MessageTable()
    h = Handle(1, table), Handle(2, table)
    bundle = Bundle(items=h, main=h[0])
    bound = bind(bundle, "bob")
    assert all(x.reader == "bob" for x in bound.items) and bound.main.reader == "bob"
    assert bundle.main.reader is None  # the original is untouched


def test_a_payload_field_takes_handles_only_and_dumps_their_ids():
    from pydantic import ValidationError

    table = MessageTable()
    h = Handle(3, table)
    bundle = Bundle(items=[h], main=h)
    assert bundle.main is h and bundle.items == (h,) and bundle.extra is None
    assert bundle.model_dump() == {"items": (3,), "main": 3, "extra": None}
    assert bundle.model_dump_json() == '{"items":[3],"main":3,"extra":null}'
    for bad in (3, "msg", {"id": 3}):
        with pytest.raises(ValidationError, match="instance of Handle"):
            Bundle(items=(), main=bad)


async def test_agents_receive_handles_bound_to_themselves(tiny_dirs):
    seen = {}

    class Reader(Agent):
        async def handle(self, msg: Bundle) -> Handle:
            seen["reader"] = msg.main.reader
            try:
                _ = msg.main.parents[0].text
            except AccessDenied as exc:
                seen["denied"] = str(exc)
            return msg.main

    async with open_tiny(tiny_dirs, "llama") as engine, Runtime(engine) as rt:
        _, remark = await _secret_and_remark(engine)
        await rt.spawn(Reader, "bob")
        back = await rt.ask("bob", Bundle(items=(remark,), main=remark))
        assert seen["reader"] == "bob" and "bob cannot read" in seen["denied"]
        assert back.reader is None  # replies are bound to the asker: here the caller


async def test_a_pickled_handle_reads_nothing_and_no_engine_takes_it(tiny_dirs):
    """A handle sent to another process (pickled, as Ray sends it) names its message but
    reads nothing, and passing it, or a handle of another engine in this process, to an
    engine raises ForeignHandle: handles never cross engines."""
    import pickle

    from corps.cache import ForeignHandle

    async with open_tiny(tiny_dirs, "llama") as a, open_tiny(tiny_dirs, "llama") as b:
        h = await a.prefill("a secret plan", owner="alice", visibility=Private())
        sent = pickle.loads(pickle.dumps(h))
        assert sent.id == h.id and sent.detached and not h.detached
        assert "another process" in repr(sent)
        for read in (lambda: sent.text, lambda: sent.tokens, lambda: sent.role):
            with pytest.raises(ForeignHandle, match="never cross engines"):
                read()
        for engine in (a, b):  # even its own engine: what arrived is not the handle
            with pytest.raises(ForeignHandle, match="never cross engines"):
                await engine.decode(parents=[sent], max_tokens=2)
        with pytest.raises(ForeignHandle, match="another engine"):
            await b.decode(parents=[h], max_tokens=2)
        assert a.stats().messages == 1 and b.stats().messages == 0
