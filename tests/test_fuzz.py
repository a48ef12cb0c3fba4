"""Fuzzing the public API and the CLI with random valid and invalid input.

Every call either succeeds or raises a typed corps error with a message (never a
bare exception), and after every call the store's bookkeeping is exact
(`Engine.check`).
"""

from __future__ import annotations

import warnings

import anyio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from typer.testing import CliRunner

from corps.agents import Agent, AgentError, Runtime
from corps.cache import Handle, Private, Public, Shared
from corps.cache.errors import CorpsError, InvalidRequest
from corps.cache.visibility import LeakWarning
from corps.cli.app import app

from conftest import open_tiny

KINDS = ["prefill", "prefill", "decode", "decode", "decode_many", "free", "read", "stream"]
KINDS += ["audited"]
#: repair policies (corps.engine.repair), valid and not
REPAIRS = [None, "none", "first:2", "recompute:0.5", "query:0.5", "full", "temp:0.8", "serial+full"]
REPAIRS += ["auto", "auto:query:0.3", "first:1+query:0.3"]
BAD_REPAIRS = ["bogus", "query:2", 3, "recompute:0.3+query:0.2", "auto+full", "auto:temp:0.5", ""]


def either(draw, valid, invalid):
    """Mostly a valid value, now and then an invalid one (1 in 8)."""
    return draw(invalid if draw(st.integers(0, 7)) == 0 else valid)


@st.composite
def operations(draw):
    kind = draw(st.sampled_from(KINDS))
    picks = draw(st.lists(st.integers(0, 50), max_size=4))  # indices into the handles so far
    common = dict(
        owner=either(draw, st.sampled_from([None, "alice", "bob"]), st.sampled_from(["", 3])),
        visibility=either(
            draw,
            st.sampled_from([None, Public(), Private(), Shared({"bob"})]),
            st.sampled_from(["public", 3]),
        ),
        offsets=either(
            draw, st.none(), st.lists(st.one_of(st.none(), st.integers(-5, 3000)), max_size=5)
        ),
        new_offset=either(draw, st.none(), st.integers(-5, 3000)),
        leak_policy=either(
            draw,
            st.sampled_from([None, "allow", "warn", "reencode"]),
            st.sampled_from(["deny", "bogus"]),
        ),
    )
    # the call made inside a workflow (its repair and audit rate apply to its calls)
    workflow = either(
        draw,
        st.one_of(
            st.none(),
            st.tuples(
                st.sampled_from(["wf-a", "wf-b"]),
                st.sampled_from(REPAIRS),
                st.sampled_from([None, 0, 1, 3]),
            ),
        ),
        st.tuples(
            st.sampled_from(["wf-a", ""]),
            st.sampled_from([*REPAIRS, *BAD_REPAIRS]),
            st.sampled_from([None, 1, -2, "x"]),
        ),
    )
    if kind == "prefill":
        args = dict(
            message=either(
                draw, st.text(min_size=1, max_size=40), st.lists(st.integers(-2, 70000), max_size=8)
            ),
            role=either(draw, st.sampled_from(["user", "system"]), st.just("")),
            frame=either(draw, st.just(True), st.just(False)),
        )
    elif kind in ("decode", "stream", "decode_many"):
        args = dict(
            max_tokens=either(draw, st.integers(1, 6), st.integers(-1, 0)),
            temperature=either(
                draw, st.sampled_from([0.0, 0.7]), st.sampled_from([-1.0, float("nan")])
            ),
            top_p=either(draw, st.sampled_from([1.0, 0.9]), st.sampled_from([0.0, 1.5])),
            top_k=either(draw, st.sampled_from([0, 3]), st.just(-1)),
            seed=either(draw, st.one_of(st.none(), st.integers(0, 2**40)), st.just("s")),
            stop=either(draw, st.sampled_from([(), ("x",)]), st.just(("",))),
            header=either(draw, st.just(""), st.lists(st.integers(-2, 70000), max_size=3)),
            frame=either(draw, st.just(True), st.just(False)),
            repair=either(draw, st.sampled_from(REPAIRS), st.sampled_from(BAD_REPAIRS)),
            audit=either(draw, st.sampled_from([None, 0, 1, 2]), st.sampled_from([-1, "x", 2.5])),
        )
        if kind == "stream":  # the reader stops early: the call is cancelled mid-decode
            args["cut"] = draw(st.booleans())
    else:
        args = {}
    return kind, picks, common, args, workflow


async def apply(engine, handles: list, op) -> None:
    *op, workflow = op
    if workflow is None:
        return await make_call(engine, handles, op)
    name, repair, audit = workflow
    with engine.workflow(name, repair=repair, audit=audit):
        await make_call(engine, handles, op)


async def make_call(engine, handles: list, op) -> None:
    kind, picks, common, args = op
    parents = [handles[i % len(handles)] for i in picks] if handles else []
    if kind == "free":
        if parents:
            engine.free(parents[0])
        return
    if kind == "read":
        if parents:
            engine.read(parents[0], reader=common["owner"])
        return
    if kind == "audited":  # every fidelity audit's shadow started so far has run
        await engine.fidelity_report()
        return
    call = dict(parents=parents, **common, **args)
    if kind == "prefill":
        handles.append(await engine.prefill(call.pop("message"), **call))
    elif kind == "decode":
        handles.append(await engine.decode(**call))
    elif kind == "decode_many":
        handles.extend(await engine.decode_many([call, dict(call, seed=1)]))
    else:
        cut = call.pop("cut")
        async with engine.stream(**call) as s:
            async for _ in s:
                if cut:
                    break
        if not cut:
            handles.append(s.handle)


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    ops=st.lists(operations(), min_size=1, max_size=12),
    mode=st.sampled_from(["choreographed", "baseline"]),
)
def test_random_calls_succeed_or_fail_typed_and_keep_the_store_exact(tiny_dirs, ops, mode):
    """Repairs and fidelity audits included: every due audit's shadow runs (budget 1)."""

    async def main() -> None:
        kw = dict(mode=mode, capacity=512, audit_budget=1.0)
        async with open_tiny(tiny_dirs, "llama", **kw) as engine:
            handles: list = []
            for op in ops:
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", LeakWarning)
                        await apply(engine, handles, op)
                except CorpsError as exc:
                    assert str(exc), f"{type(exc).__name__} without a message"
                try:
                    engine.check()
                except InvalidRequest:  # audits' shadows still running: checked once settled
                    pass
            await engine.fidelity_report()  # the shadows left running, then the books again
            engine.check()

    anyio.run(main)


runner = CliRunner()
SET_KEYS = ["max_tokens", "rounds", "branches", "voters", "temperature", "seed", "question", "x"]
SET_VALUES = ["1", "0", "-3", "2.5", "abc", "", "[1,2]", "true", "9999999999"]


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    target=st.sampled_from(["debate", "tree-of-thoughts", "multi-qa", "nope", "x.toml", ""]),
    sets=st.lists(st.tuples(st.sampled_from(SET_KEYS), st.sampled_from(SET_VALUES)), max_size=3),
    extra=st.lists(
        st.sampled_from(
            [
                ["--mode", "bogus"],
                ["--leak-policy", "x"],
                ["--dtype", "int8"],
                ["--concurrency", "0"],
                ["--seed", "-1"],
                ["--mode", "baseline"],
            ]
        ),
        max_size=2,
    ),
)
def test_random_cli_arguments_never_crash(tiny_dirs, target, sets, extra):
    args = ["run", target, "--model", str(tiny_dirs["llama"]), "--no-live", "--set", "max_tokens=2"]
    for k, v in sets:
        args += ["--set", f"{k}={v}"]
    for e in extra:
        args += e
    result = runner.invoke(app, args)
    assert result.exit_code in (0, 1, 2), (args, result.output, result.exception)
    assert "Traceback" not in result.output, (args, result.output)
    if result.exception is not None:
        assert isinstance(result.exception, SystemExit), (args, repr(result.exception))


class Payload(BaseModel):
    text: str = ""
    handles: list[Handle] = []
    model_config = {"arbitrary_types_allowed": True}


class Echo(Agent):
    max_restarts = 10**6  # a failed send restarts it; the last ask checks it still serves

    async def handle(self, msg):
        handles = [msg] if isinstance(msg, Handle) else getattr(msg, "handles", [])
        for h in handles:
            _ = h.text  # reading what it was sent is checked against its visibility
        return msg


PAYLOADS = st.one_of(
    st.text(max_size=5),
    st.integers(),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.none(),
    st.builds(Payload, text=st.text(max_size=5)),
    st.sampled_from(["public", "private"]),  # replaced by a handle of that visibility
)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    payloads=st.lists(st.tuples(PAYLOADS, st.sampled_from(["ask", "send", "publish"])), max_size=6)
)
def test_random_payloads_between_agents_fail_typed(tiny_dirs, payloads):
    async def main() -> None:
        async with open_tiny(tiny_dirs, "llama") as engine, Runtime(engine) as rt:
            await rt.spawn(Echo, "echo")
            rt.subscribe("t", "echo")
            secret = await engine.prefill("s", owner="alice", visibility=Private())
            public = await engine.prefill("p")
            for payload, how in payloads:
                if payload == "public":
                    payload = public
                elif payload == "private":
                    payload = Payload(handles=[secret])
                try:
                    if how == "ask":
                        await rt.ask("echo", payload, timeout=10)
                    elif how == "send":
                        await rt.send("echo", payload)
                    else:
                        await rt.publish("t", payload)
                except (CorpsError, AgentError) as exc:
                    assert str(exc)
            await rt.ask("echo", public, timeout=10)  # still serving
        engine.check()

    anyio.run(main)
