"""Planning a call: framing its tokens, placing its parents, checking it, before any compute.

A `Call` is one planned prefill or decode: what it attends to (context slots at
the positions the call gives them), what it must encode (its feed), and the
step-machine state the core advances. Planning raises on bad input and touches
nothing, so a rejected call leaves the store exactly as it was.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from corps.cache.handle import Handle
from corps.cache.messages import Message, MessageTable
from corps.cache.placement import check_limit, place
from corps.cache.radix import Node
from corps.cache.view import CallView
from corps.engine.chat import ChatFormat
from corps.engine.errors import InvalidRequest
from corps.engine.requests import DecodeRequest, PrefillRequest
from corps.engine.sampling import SamplingParams


@dataclass(frozen=True)
class CallPlan:
    """What a call is, fixed when it is planned: what it makes and from what."""

    kind: str  # "prefill", "decode" or "sink"
    role: str
    offset: int  # logical position of the new message's first token
    parents: tuple[int, ...]  # message ids it attends to, in order
    parent_offsets: tuple[int, ...]  # where each parent sits
    owner: str | None
    visibility: object
    own: int  # how many trailing prompt tokens belong to the new message
    prefix: list[int]  # the whole prompt (choreographed: = its own tokens); not mutated
    pinned: tuple[Message, ...] = ()  # parents, pinned while the call runs
    sampling: SamplingParams | None = None  # a decode's; None for a prefill
    frame_len: int = 0  # leading own tokens that are role framing, not text
    footer: tuple[int, ...] = ()  # the role's closing tokens (a framed decode)

    @property
    def is_decode(self) -> bool:
        return self.sampling is not None


@dataclass(eq=False)
class Call:
    """One call in flight: its frozen `plan`, and the state the step machine advances
    (what it attends to and still has to encode, the slots it holds, its tokens)."""

    plan: CallPlan
    ctx_slots: list[int]  # store slots it attends to (baseline: its cached prefix)
    ctx_pos: list[int]  # the positions it gives them
    feed: list[int]  # tokens to encode before sampling (choreo: the message; baseline: uncached)
    feed_start: int  # logical position of feed[0]
    text: str = ""  # the message's text (a decode's is set when it finishes)
    closing: list[int] = field(default_factory=list)  # footer tokens still to encode, in order
    closed: list[int] = field(default_factory=list)  # footer tokens taken after the generated
    lock: Node | None = None
    first_token_at: float | None = None  # hf mode: when generate emitted the first token
    uid: int = 0  # baseline: tags the radix nodes this call inserts
    cached: int = 0  # baseline: leading feed tokens whose slots the radix tree owns now
    pins_held: bool = False
    slots: list[int] = field(default_factory=list)  # slots taken for feed + generated
    adapted: bool = False  # an adapter kept apart applies to its rows (`Core.adapted`)
    spare: list[int] = field(default_factory=list)  # reserved for tokens not generated yet
    generated: list[int] = field(default_factory=list)
    view: CallView | None = None
    generator: torch.Generator | None = None  # a sampled decode's own random stream
    want_logits: bool = False
    text_only: bool = False  # baseline / hf prefill: stores its text, runs nothing
    reused: int = 0  # context tokens read from the store, not encoded (0 without a view)
    fed: int = 0  # feed tokens encoded so far
    encoded: int = 0  # tokens this call ran through the model (feed + generated)
    pending: int | None = None  # sampled token not yet encoded
    jumped: list[int] = field(default_factory=list)  # forced tokens after it (jump-forward)
    finishing: bool = False  # the pending token is the last one
    done: bool = False  # everything encoded; ready for finish()
    logits: list[Tensor] = field(default_factory=list)  # want_logits: own rows, per chunk
    scores: Tensor | None = None  # sampling.logprobs: this step's log-softmax row (V,)
    logprobs: list[float] = field(default_factory=list)  # sampling.logprobs: per emitted token
    greedy: list[int] = field(default_factory=list)  # sampling.logprobs: argmax per position
    matcher: Any = None  # a constrained decode's grammar state (llguidance)
    finish_reason: str | None = None  # why a decode stopped (see Sampler.stops)
    spans: list[int] = field(default_factory=list)  # tokens it encoded in each step
    replay: tuple[int, ...] = ()  # a recompute: the spans its feed must be encoded in

    @property
    def next_keys(self) -> int:
        """Keys a one-row step of this call attends over: its view with the token it
        adds (0 without a view). What it adds to a step's `step_cost.decode_keys`."""
        return 0 if self.view is None else self.view.length + 1


class Planner:
    """Turns requests into Calls for one engine's format, message table and mode."""

    def __init__(
        self,
        fmt: ChatFormat,
        table: MessageTable,
        *,
        mode: str,
        max_positions: int,
        vocab_size: int,
    ) -> None:
        self.fmt = fmt
        self.table = table
        self.mode = mode
        self.max_positions = max_positions
        self.vocab_size = vocab_size
        self.sink_slots: list[int] = []  # the attention sink every call sees, once encoded

    def _message_tokens(self, content, role: str, frame: bool) -> tuple[list[int], str]:
        if not frame:
            ids = self.fmt.encode(content) if isinstance(content, str) else list(content)
            text = content if isinstance(content, str) else self.fmt.decode(ids)
            return ids, text
        header, footer = self.fmt.frame(role)
        if isinstance(content, str):
            return self.fmt.encode(header + content + footer), content
        ids = list(content)
        return self.fmt.encode(header) + ids + self.fmt.encode(footer), self.fmt.decode(ids)

    def _header_tokens(self, req: DecodeRequest) -> list[int]:
        user = self.fmt.encode(req.header) if isinstance(req.header, str) else list(req.header)
        if not req.frame:
            return user
        return self.fmt.encode(self.fmt.frame(req.role)[0]) + user

    def prefill(self, req: PrefillRequest) -> Call:
        tokens, text = self._message_tokens(req.message, req.role, req.frame)
        self._check_vocab(tokens)
        return self._plan(req, tokens, text, "prefill", generate=0)

    def decode(self, req: DecodeRequest) -> Call:
        header = self._header_tokens(req)
        self._check_vocab(header)
        self._check_vocab(list(req.sampling.force))
        footer = self.fmt.encode(self.fmt.frame(req.role)[1]) if req.frame else []
        frame_len = len(self.fmt.encode(self.fmt.frame(req.role)[0])) if req.frame else 0
        generate = req.sampling.max_tokens + len(footer)
        decode = dict(sampling=req.sampling, frame_len=frame_len, footer=tuple(footer))
        call = self._plan(req, header, "", "decode", generate=generate, **decode)
        call.generator = req.sampling.generator()
        return call

    def _plan(self, req, tokens: list[int], text: str, kind: str, generate: int, **decode) -> Call:
        parents = [self.live(p) for p in req.parents]
        sink = len(self.fmt.sink)
        placed = place([len(p.tokens) for p in parents], req.offsets, req.new_offset, sink=sink)
        for p, start in zip(parents, placed.starts, strict=True):
            check_limit(start + len(p.tokens) - 1, self.max_positions, f"parent {p.id}")
        ctx_slots, ctx_pos = self.context(parents, placed.starts)
        prompt, starts, offset = list(tokens), placed.starts, placed.new_offset
        feed, feed_start = tokens, offset
        if self.mode != "choreographed":  # baseline and hf render one causal prompt
            prompt = list(self.fmt.sink) + [t for p in parents for t in p.tokens] + tokens
            starts = tuple(_starts(sink, [len(p.tokens) for p in parents]))
            offset = len(prompt) - len(tokens)
            ctx_slots, ctx_pos, feed, feed_start = [], [], prompt, 0
        end = feed_start + len(feed) + generate - 1
        check_limit(end, self.max_positions, f"the new {kind} message")
        plan = CallPlan(
            kind=kind,
            role=req.role,
            offset=offset,
            parents=tuple(p.id for p in parents),
            parent_offsets=starts,
            owner=req.owner,
            visibility=req.visibility,
            own=len(tokens),
            prefix=prompt,
            pinned=tuple(parents),
            **decode,
        )
        return Call(plan, ctx_slots, ctx_pos, feed, feed_start, text=text)

    def context(
        self, parents: Sequence[Message], starts: Sequence[int]
    ) -> tuple[list[int], list[int]]:
        """A choreographed call's context: the sink and its parents' store slots, and
        the positions it gives them (each parent from its start)."""
        ctx_slots: list[int] = list(self.sink_slots)
        ctx_pos: list[int] = list(range(len(ctx_slots)))
        for p, start in zip(parents, starts, strict=True):
            ctx_slots += p.slots
            ctx_pos += range(start, start + len(p.tokens))
        return ctx_slots, ctx_pos

    def _check_vocab(self, tokens: list[int]) -> None:
        vocab = self.vocab_size
        bad = [t for t in tokens if t >= vocab]
        if bad:
            raise InvalidRequest(f"token id {bad[0]} is outside the vocabulary (size {vocab})")

    def live(self, handle: Handle) -> Message:
        """The message a handle names, if its encoding is still there (not freed, or
        freed but pinned by the call being planned); else UnknownHandle / InvalidRequest."""
        if not isinstance(handle, Handle):
            raise InvalidRequest(f"expected a Handle, got {type(handle).__name__}")
        self.table.own(handle)
        msg = self.table.get(handle.id)
        if msg.freed and msg.pins == 0:  # freed and not kept by a queued call: gone
            return self.table.live(handle.id)  # raises, saying so
        return msg


def _starts(sink: int, lengths: list[int]) -> list[int]:
    out, cursor = [], sink
    for n in lengths:
        out.append(cursor)
        cursor += n
    return out
