"""Finishing a call: its message registered in the table (`Finisher`), and the
attention sink every choreographed call sees, encoded once when the core opens."""

from __future__ import annotations

from collections.abc import Callable

from corps.cache.handle import Handle
from corps.engine.exec.call import Call, CallPlan
from corps.engine.exec.memory import Memory
from corps.engine.exec.register import own_tokens, register
from corps.engine.exec.sampler import Sampler
from corps.engine.exec.step_plan import PREFILL_CHUNK
from corps.engine.request.chat_format import ChatFormat


class Finisher:
    """Turns done calls into messages: the table's one writer of new records."""

    def __init__(self, memory: Memory, sampler: Sampler, *, choreographed: bool) -> None:
        self.memory, self.sampler, self.table = memory, sampler, memory.table
        self.prefixes = memory.prefixes  # the baseline's radix tree (None: choreographed)
        self.choreographed = choreographed

    def finish(self, c: Call) -> Handle:
        """Register a done call's message, give back what it no longer needs (its view,
        unused reservations, its parents' pins); its handle."""
        assert c.done, "finish() needs a call whose step machine is done"
        handle = self._decode(c) if c.plan.is_decode else self._prefill(c)
        self.memory.drop_view(c)
        self.memory.release_spare(c)
        return handle

    def _prefill(self, c: Call) -> Handle:
        if c.text_only:  # baseline prefill: text only
            return self._register(c, own_tokens(c), [])
        if self.prefixes is not None:
            self.prefixes.cache(c, c.plan.prefix)
            return self._register(c, own_tokens(c), [])
        return self._register(c, c.feed, c.slots)

    def _decode(self, c: Call) -> Handle:
        tokens = own_tokens(c) + c.generated
        c.text = self.sampler.text(tokens[c.plan.frame_len :], c.plan.sampling)
        tokens += c.closed
        if self.prefixes is not None:  # its last generated token(s) were never encoded
            self.prefixes.cache(c, c.plan.prefix + encoded_reply(c))
            return self._register(c, tokens, [])
        if c.plan.final:
            return self._set_aside(c, tokens)
        return self._register(c, tokens, c.slots)

    def _set_aside(self, c: Call, tokens: list[int]) -> Handle:
        """A final reply (no call reads it): registered, its partial encoding given back
        and the message marked evicted, to be encoded again from its tokens (in prompt
        chunks, `corps.engine.exec.restorer`) should a call read it after all."""
        handle = self._register(c, tokens, c.slots)
        msg = self.table.get(handle.id)
        msg.spans = tuple(chunked(len(tokens), PREFILL_CHUNK))
        self.memory.set_aside(msg)
        return handle

    def _register(self, c: Call, tokens: list[int], slots: list[int]) -> Handle:
        handle = register(self.table, c, tokens, slots, reused_encodings=self.choreographed)
        self.memory.unpin_call(c)
        return handle


def chunked(n: int, chunk: int) -> list[int]:
    """n tokens as spans of at most `chunk`: [chunk, ..., rest]."""
    return [min(chunk, n - start) for start in range(0, n, chunk)]


def encoded_reply(c: Call) -> list[int]:
    """The tokens a baseline decode ran through the model of those it generated: its
    last token (and the tokens jumped after it) never were."""
    return c.generated[: max(0, len(c.generated) - 1 - len(c.jumped))]


def open_sink(
    fmt: ChatFormat, memory: Memory, run_alone: Callable[[Call], None], finisher: Finisher
) -> Handle | None:
    """Encode the format's attention sink (choreographed mode, where it has one)."""
    if not finisher.choreographed or not fmt.sink:
        return None
    sink = list(fmt.sink)
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
    memory.reserve(call, 0)
    memory.gather(call, len(sink))
    run_alone(call)
    return finisher.finish(call)
