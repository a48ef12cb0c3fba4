"""A call in flight: its frozen plan (`CallPlan`) and the state its steps advance (`Call`).

A call's status moves waiting -> prefilling -> decoding -> finishing -> done (a
prefill is done once its feed is encoded). Its holdings (`slots`, `spare`,
`view`, `lock`, `pins`) are written by `corps.engine.exec.memory`; its
decoding state through the transitions below, by the executor's postprocess
(`corps.engine.exec.postprocess.Postprocess`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from corps.cache.messages import Message
from corps.cache.radix import Node
from corps.cache.view import CallView
from corps.engine.exec.repair_rows import RepairRows
from corps.engine.request.sampling_params import SamplingParams


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
    pinned: tuple[Message, ...] = ()  # its parents' records (kept pinned: `Call.pins`)
    sampling: SamplingParams | None = None  # a decode's; None for a prefill
    frame_len: int = 0  # leading own tokens that are role framing, not text
    footer: tuple[int, ...] = ()  # the role's closing tokens (a framed decode)
    salt: str | None = None  # the baseline prefix cache's namespace (DecodeRequest.cache_salt)
    final: bool = False  # a decode no call reads: its last token and footer stay unencoded

    @property
    def is_decode(self) -> bool:
        return self.sampling is not None

    @property
    def generated_max(self) -> int:
        """Slots a call may need beyond its feed: every token it may generate and its
        closing footer (reserved at admission, so it never runs out mid-generation;
        checked against the model's positions when it is planned). 0 for a prefill."""
        return self.sampling.max_tokens + len(self.footer) if self.sampling is not None else 0


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
    # the pins it holds on its parents while it runs, each once: those its job took at
    # submission (handed over at admission: a free while it was queued waited for it),
    # else its own from `Memory.reserve`; given back once as it ends (`Memory.unpin_call`)
    pins: list[Message] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)  # slots taken for feed + generated
    adapted: bool = False  # an adapter kept apart applies to its rows (`KVExecutor.adapted`)
    spare: list[int] = field(default_factory=list)  # reserved for tokens not generated yet
    generated: list[int] = field(default_factory=list)
    view: CallView | None = None
    generator: torch.Generator | None = None  # a sampled decode's own random stream
    want_logits: bool = False
    # an audit (`corps.engine.api.audit`): the model's distribution (log-softmax, before
    # any bias or mask) at its first `keep` sampled positions, as (position, row (V,))
    keep: int = 0
    kept: list[tuple[int, Tensor]] = field(default_factory=list)
    text_only: bool = False  # baseline / hf prefill: stores its text, runs nothing
    reused: int = 0  # context tokens read from the store, not encoded (0 without a view)
    fed: int = 0  # feed tokens encoded so far
    encoded: int = 0  # tokens this call ran through the model (feed + generated)
    pending: int | None = None  # sampled token not yet encoded
    jumped: list[int] = field(default_factory=list)  # forced tokens after it (jump-forward)
    finishing: bool = False  # the pending token is the last one
    done: bool = False  # everything encoded, or given back (set by `mark_done` only)
    logits: list[Tensor] = field(default_factory=list)  # want_logits: own rows, per chunk
    scores: Tensor | None = None  # sampling.logprobs: this step's log-softmax row (V,)
    scored: int | None = None  # the token accepted from `scores`, noted at the step's end
    logprobs: list[float] = field(default_factory=list)  # sampling.logprobs: per emitted token
    greedy: list[int] = field(default_factory=list)  # sampling.logprobs: argmax per position
    # sampling.top_logprobs: the k most likely (token, log-probability) per position
    top: list[tuple[tuple[int, float], ...]] = field(default_factory=list)
    matcher: Any = None  # a constrained decode's grammar state (llguidance)
    finish_reason: str | None = None  # why a decode stopped (see Sampler.stops)
    spans: list[int] = field(default_factory=list)  # tokens it encoded in each step
    first_spans: tuple[int, ...] = ()  # a recompute: the spans its feed was first encoded in
    repair: RepairRows | None = None  # context tokens it recomputes first (`exec.repairs`)
    # the policy of a repaired context another call built and this one reads, recomputing
    # nothing itself (`Repairs.tag`: calls over the same context repaired alike share it)
    repair_read: str | None = None

    @property
    def status(self) -> str:
        """Where the call's step machine is: "waiting" (nothing encoded yet),
        "prefilling" (part of its feed encoded), "decoding" (a sampled token pending),
        "finishing" (its last token pending, with the footer that closes its turn) or
        "done" (ready for `finish`, or given back)."""
        if self.done:
            return "done"
        if self.finishing:
            return "finishing"
        if self.pending is not None:
            return "decoding"
        return "prefilling" if self.fed else "waiting"

    @property
    def repair_done(self) -> bool:
        """Its repair rows have all run (or it has none): its context is whole."""
        r = self.repair
        return r is None or (r.probe is None and r.left == 0)

    @property
    def repaired(self) -> int:
        """Context tokens it recomputes (`corps.engine.exec.repairs`)."""
        return self.repair.total if self.repair is not None else 0

    @property
    def budget_left(self) -> int:
        """Tokens the decode may still generate."""
        return self.plan.sampling.max_tokens - len(self.generated)

    def mark_done(self) -> None:
        """Nothing left to run: its prompt is encoded (a prefill), it stores its text
        only, or it was given back. The one place outside the decoding transitions
        below (`encoded_pending`, `close_unencoded`) that ends a call."""
        self.done = True

    def fed_rows(self, n: int) -> bool:
        """n more feed tokens were encoded; whether the whole feed is encoded now."""
        self.fed += n
        return self.fed >= len(self.feed)

    def encoded_pending(self) -> None:
        """Its pending token (and what it jumped to, and a finishing call's footer)
        was encoded; a finishing call's turn is closed and it is done."""
        self.pending, self.jumped = None, []
        if self.finishing:
            self.closed += self.closing
            self.closing = []
            self.mark_done()

    def accept(self, tok: int) -> None:
        """A token sampled for it: generated, and pending until its next step. From a
        scored row, the token is noted with the step's others (`exec.scores.note`)."""
        self.generated.append(tok)
        if self.scores is not None:
            self.scored = tok
        self.pending = tok

    def jump(self, forced: list[int]) -> None:
        """Tokens its constraint forces next, appended without sampling (encoded with
        its pending token as one span next step)."""
        self.generated += forced
        self.jumped = forced

    def finish_with(self, reason: str | None, closing: list[int]) -> None:
        """Its last token is pending (a stop `reason`): the footer tokens `closing`
        close its turn, encoded with it next step."""
        self.finish_reason, self.finishing, self.closing = reason, True, closing

    def close_unencoded(self) -> None:
        """Done without encoding its last token and footer (the baseline, which
        re-encodes a turn's text wherever it is read)."""
        self.closed, self.closing, self.pending = self.closing, [], None
        self.mark_done()

    @property
    def awaited(self) -> bool:
        """Other calls wait to join the repaired context it built (`Memory.being_written`):
        it must keep the context until they have."""
        ctx = self.view.ctx if self.view is not None else None
        return ctx is not None and ctx.writer is self and ctx.awaited

    @property
    def next_keys(self) -> int:
        """Keys a one-row step of this call attends over: its view with the token it
        adds (0 without a view). What it adds to a step's `step_plan.decode_keys`."""
        return 0 if self.view is None else self.view.length + 1


def top_of(scores: Tensor, k: int) -> list[tuple[tuple[int, float], ...]]:
    """[the k most likely (token, log-probability) of a (V,) row], or [] for k = 0."""
    if not k:
        return []
    vals, ids = scores.topk(k)
    return [tuple(zip(ids.tolist(), vals.tolist(), strict=True))]
