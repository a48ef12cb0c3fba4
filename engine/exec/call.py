"""The one record of a call (`Call`), from the request it was made for to its message.

A request becomes a `Call` once it is checked (`Call.queued`: its facts for the
scheduler, and the waiter of the caller's async side); the executor plans it when
it is admitted (`plan`, a frozen `CallPlan`: what it makes and from what) and its
steps advance it. Its status moves queued -> waiting -> prefilling -> decoding ->
finishing -> done (a prefill is done once its feed is encoded); the scheduler ends
it. Its holdings (`slots`, `spare`, `view`, `lock`, `pins`) are written by
`corps.engine.exec.memory`; its decoding state through the transitions below, by
the executor's postprocess (`corps.engine.exec.postprocess.Postprocess`). The
pins on its parents have one owner: `Call.pins`, taken at submission (or by
`Memory.reserve` for a call made without them) and given back once as it ends.

The caller's side (event loop only): `ended` is set once when the scheduler ends
the call; `wait` returns its handle or raises its error; `abandon` cancels it and
waits until the loop has ended it. The torch thread never touches these.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

import anyio
import torch
from torch import Tensor

from corps.cache.handle import Handle
from corps.cache.messages import CallFigures, Message
from corps.cache.radix import Node
from corps.cache.view import CallView
from corps.engine.config import STEP_TOKENS
from corps.engine.errors import CallCancelled
from corps.engine.exec.repair_rows import RepairRows
from corps.engine.request.sampling_params import SamplingParams

#: the prompt tokens a call brings to a step at most, on a CPU (`step_plan`)
PREFILL_CHUNK = STEP_TOKENS["cpu"]


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
    records: tuple[Message, ...] = ()  # its parents' records (pinned: `Call.pins`)
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
    """One call, from its checked request to its message: the facts the scheduler
    reads, its frozen `plan` once admitted, the state the step machine advances
    (what it attends to and still has to encode, the slots it holds, its tokens),
    and the caller's waiter. Made by `Call.queued` for a caller, or planned
    directly by the executor for its own calls (the sink, a recompute)."""

    plan: CallPlan | None = None  # set when the executor plans it (admission)
    ctx_slots: list[int] = field(default_factory=list)  # store slots it attends to
    ctx_pos: list[int] = field(default_factory=list)  # the positions it gives them
    feed: list[int] = field(default_factory=list)  # tokens to encode before sampling
    feed_start: int = 0  # logical position of feed[0]
    # ---- what the caller asked, fixed at submission (kept by `unplan`) ----
    request: Any = None  # the checked PrefillRequest / DecodeRequest
    id: int = 0  # the engine's call id (traces)
    want_logits: bool = False  # keep its own rows' logits (`logits`)
    # an audit (`corps.engine.api.audit`): the model's distribution (log-softmax, before
    # any bias or mask) at its first `keep` sampled positions, as (position, row (V,))
    keep: int = 0
    # the pins it holds on its parents, each once: taken at submission (a free while it
    # is queued waits for it), else by `Memory.reserve`; given back once as it ends
    pins: list[Message] = field(default_factory=list)
    # what scheduling policies read (corps.engine.sched.policies, corps.engine.request.workflow)
    workflow: Any = None  # the Workflow it was made in
    objective: str = "throughput"
    # a latency call that bounds the batch while it runs (`objective` policy): one made
    # alone, or asked latency itself; a task group of a latency workflow is latency
    # (admitted first) but not critical: the group's completion is what counts
    critical: bool = False
    group: int = 0  # its task group: calls submitted together (its own id alone)
    leaks: int = 0  # leaks the guard recorded for this call
    # it came with its message, made by an earlier run (`corps.engine.api.turns`): it
    # never runs, and nothing that ends it frees that message
    replayed: bool = False
    # ---- the caller's side and the scheduler's bookkeeping (event loop) ----
    ended: anyio.Event | None = None  # set once as the scheduler ends it (`Call.queued`)
    on_token: Callable[[int], None] | None = None  # each sampled token
    on_done: Callable[[], None] | None = None  # when it ends, before its waiter wakes
    handle: Handle | None = None  # its message, once made
    error: BaseException | None = None
    cancelled: bool = False
    submitted: float = field(default_factory=time.perf_counter)
    admitted: float | None = None  # when its first step began
    first_token: float | None = None  # hf mode: set when generate emitted it
    emitted: int = 0  # sampled tokens handed to the caller so far
    skipped: int = 0  # steps in a row the policy left it out of (`objective`)
    charged: int = 0  # of its encoded tokens, those already counted (`fair`)
    # ---- the step machine's state (written by the executor) ----
    text: str = ""  # the message's text (a decode's is set when it finishes)
    closing: list[int] = field(default_factory=list)  # footer tokens still to encode, in order
    closed: list[int] = field(default_factory=list)  # footer tokens taken after the generated
    lock: Node | None = None
    uid: int = 0  # baseline: tags the radix nodes this call inserts
    cached: int = 0  # baseline: leading feed tokens whose slots the radix tree owns now
    slots: list[int] = field(default_factory=list)  # slots taken for feed + generated
    adapted: bool = False  # an adapter kept apart applies to its rows (`KVExecutor.adapted`)
    spare: list[int] = field(default_factory=list)  # reserved for tokens not generated yet
    generated: list[int] = field(default_factory=list)
    view: CallView | None = None
    generator: torch.Generator | None = None  # a sampled decode's own random stream
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

    @classmethod
    def queued(cls, request: Any, **facts: Any) -> Call:
        """The record a checked request becomes, with its waiter (event loop only)."""
        return cls(request=request, ended=anyio.Event(), **facts)

    def unplan(self) -> None:
        """Back to queued: every field the executor writes at its defaults (an admission
        that could not finish: the call waits, and is planned again later). What the
        caller asked, its pins and the scheduler's bookkeeping stay."""
        for f in fields(self):
            if f.name in _PLANNED:
                default = f.default if f.default_factory is MISSING else f.default_factory()
                setattr(self, f.name, default)

    @property
    def status(self) -> str:
        """Where the call is: "queued" (not planned yet), "waiting" (nothing encoded yet),
        "prefilling" (part of its feed encoded), "decoding" (a sampled token pending),
        "finishing" (its last token pending, with the footer that closes its turn) or
        "done" (ready for `finish`, or given back)."""
        if self.plan is None:
            return "done" if self.ended is not None and self.ended.is_set() else "queued"
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

    def next_rows(self, chunk: int = PREFILL_CHUNK) -> int:
        """Rows it brings to its next step when the budget does not cut it: its pending
        token with what it jumped to and its closing footer when decoding, its repair
        rows (`corps.engine.exec.repairs`), else the next chunk of its prompt
        (`next_chunk`); 0 when it has nothing left to run."""
        if self.pending is not None:
            return 1 + len(self.jumped) + len(self.closing)
        if self.repair is not None and self.repair.left:
            return min(self.repair.left, chunk)
        return self.next_chunk(chunk)

    def next_chunk(self, chunk: int = PREFILL_CHUNK) -> int:
        """The next chunk of its prompt: at most `chunk` tokens, or for a recompute its
        next recorded span; 0 when its prompt is all encoded."""
        left = len(self.feed) - self.fed
        if left <= 0:
            return 0
        if self.first_spans:
            return self.first_spans[len(self.spans)]
        return min(left, chunk)

    @property
    def rows(self) -> int:
        """Rows it brings to its next step (`next_rows`; policies bound steps by it);
        1 before it is planned."""
        return 1 if self.plan is None else max(1, self.next_rows())

    @property
    def keys(self) -> int:
        """Keys it attends over in its next step when that step is one row
        (`next_keys`; 0 before it is planned)."""
        return self.next_keys

    @property
    def next_keys(self) -> int:
        """Keys a one-row step of this call attends over: its view with the token it
        adds (0 without a view). What it adds to a step's `step_plan.decode_keys`."""
        return 0 if self.view is None else self.view.length + 1

    # ---- the caller's side (event loop only) ----

    def figures(self) -> CallFigures:
        """What this call cost (its message keeps it: `Handle.tokens_encoded`, ...)."""
        first = self.first_token
        return CallFigures(
            tokens_encoded=self.encoded,
            tokens_reused=self.reused,
            tokens_repaired=self.repaired,
            tokens_repair_cut=self.repair.cut if self.repair else 0,
            ttft_s=first - self.submitted if first is not None else None,
            leaks=self.leaks,
        )

    def run_on_done(self) -> None:
        """Run `on_done` once, as the call ends; its error becomes the call's."""
        if self.on_done is not None:
            on_done, self.on_done = self.on_done, None
            try:
                on_done()
            except Exception as exc:
                self.error = self.error or exc

    def token(self, tok: int) -> None:
        """Pass a sampled token to `on_token`; a callback error fails this call only."""
        if self.on_token is None or self.cancelled:
            return
        try:
            self.on_token(tok)
        except Exception as exc:
            self.error, self.cancelled = exc, True  # aborted before the next step

    async def abandon(self) -> None:
        """Cancel the call and wait until the loop has ended it: between steps it
        aborts it (its partial tokens rolled back, its slots and pins given back), or
        ends it with the engine (`close`). Shielded, so that a caller leaving a call
        by cancellation leaves the store as it was when it returns. The call must
        have been submitted (the loop is what ends it)."""
        self.cancelled = True
        with anyio.CancelScope(shield=True):
            await self.ended.wait()

    async def wait(self) -> Handle:
        """The handle, or the call's error; cancelling the wait cancels the call and
        returns once the loop has ended it (`abandon`; a handle it finished with
        meanwhile is the waiter's to free: `Scheduler.wait`)."""
        try:
            await self.ended.wait()
        except BaseException:
            await self.abandon()
            raise
        if self.error is not None:
            raise self.error
        if self.handle is None:  # cancelled (Pending.cancel) before it finished
            raise CallCancelled("this call was cancelled before it finished; it left no message")
        return self.handle


#: what `Call.unplan` keeps: what the caller asked and the caller's side; every other
#: field is the executor's (planned and stepped) and goes back to its default, so a
#: field added for the executor is reset without being listed here
_KEPT = frozenset(
    "request id want_logits keep pins workflow objective critical group leaks replayed "
    "ended on_token on_done handle error cancelled submitted admitted first_token emitted "
    "skipped charged".split()
)
_PLANNED = frozenset(f.name for f in fields(Call)) - _KEPT


def top_of(scores: Tensor, k: int) -> list[tuple[tuple[int, float], ...]]:
    """[the k most likely (token, log-probability) of a (V,) row], or [] for k = 0."""
    if not k:
        return []
    vals, ids = scores.topk(k)
    return [tuple(zip(ids.tolist(), vals.tolist(), strict=True))]
