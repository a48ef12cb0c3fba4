"""Finishing a call: its message registered in the table, and the attention sink
every choreographed call sees, encoded once when the core opens."""

from __future__ import annotations

from typing import TYPE_CHECKING

from corps.cache.handle import Handle
from corps.engine.exec.call import Call, CallPlan
from corps.engine.exec.register import own_tokens, register

if TYPE_CHECKING:
    from corps.engine.exec.core import Core


def finish_prefill(core: Core, c: Call) -> Handle:
    if c.text_only:  # baseline prefill: text only
        return _register(core, c, own_tokens(c), [])
    if core.prefixes is not None:
        core.prefixes.cache(c, c.plan.prefix)
        return _register(core, c, own_tokens(c), [])
    return _register(core, c, c.feed, c.slots)


def finish_decode(core: Core, c: Call) -> Handle:
    tokens = own_tokens(c) + c.generated
    c.text = core.sampler.text(tokens[c.plan.frame_len :], c.plan.sampling)
    tokens += c.closed
    if core.prefixes is not None:  # its last generated token(s) were never encoded
        encoded = len(c.generated) - 1 - len(c.jumped)
        core.prefixes.cache(c, c.plan.prefix + c.generated[:encoded])
        return _register(core, c, tokens, [])
    return _register(core, c, tokens, c.slots)


def _register(core: Core, c: Call, tokens: list[int], slots: list[int]) -> Handle:
    handle = register(core.table, c, tokens, slots, reused_encodings=core.mode == "choreographed")
    core.memory.unpin_call(c)
    return handle


def make_sink(core: Core) -> Handle | None:
    """Encode the format's attention sink (choreographed mode, where it has one)."""
    if core.mode != "choreographed" or not core.fmt.sink:
        return None
    sink = list(core.fmt.sink)
    plan = CallPlan(
        kind="sink",
        role="sink",
        offset=0,
        parents=(),
        parent_offsets=(),
        owner=None,
        visibility=None,
        own=len(sink),
        prefix=list(sink),
    )
    call = Call(plan, ctx_slots=[], ctx_pos=[], feed=sink, feed_start=0)
    core.memory.reserve(call, 0)
    core.memory.gather(call, len(sink))
    core.run_alone(call)
    return core.finish(call)
