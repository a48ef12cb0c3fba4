"""The synchronous core of the engine: plans calls over the store and runs them.

Two modes share everything but planning:

- choreographed: a call's context is its parents' cached K/V, placed at the
  offsets the call gives; only the new message is encoded.
- baseline: a call renders its parents' tokens as one causal prompt; the
  longest cached prefix comes from a radix tree, the rest is encoded.

Every call is validated and planned before anything is computed, and every
slot it takes is given back if it fails, so a failed call leaves the store as
it was.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from corps.cache.arena import ViewArena
from corps.cache.context import ContextPool
from corps.cache.errors import CacheFullError, StoreTooSmall
from corps.cache.handle import Handle
from corps.cache.kv import KVStore
from corps.cache.messages import Message, MessageTable
from corps.cache.radix import RadixCache
from corps.cache.view import CallView
from corps.engine.attention import AttentionBackend, select_backend
from corps.engine.chat import ChatFormat
from corps.engine.config import CONTEXTS, MODES
from corps.engine.errors import InvalidRequest
from corps.engine.planner import Call, Planner
from corps.engine.requests import DecodeRequest, PrefillRequest
from corps.engine.runner import ForwardBatch, ModelRunner, SeqSpan
from corps.engine.sampling import SamplingParams, argmax_rows, forced, sample, sample_rows
from corps.engine.stats import EngineStats
from corps.engine.weights import Weights

#: Longest piece of one call's prompt encoded in a single forward step.
PREFILL_CHUNK = 512
#: Baseline: a call waits for a running call's prompt when they share at least
#: this many tokens nobody has encoded yet (SGLang's in-batch threshold is 32 too).
HOLD_MIN_SHARED = 32
#: While calls are prefilling, they get at least 1/PREFILL_SHARE of each step's tokens.
PREFILL_SHARE = 8

TokenCallback = Callable[[int, int], None]  # (call index, token id)


@dataclass
class StepOutput:
    """What one step did: tokens sampled, and calls that failed (already rolled back)."""

    tokens: list[tuple[Call, int]] = field(default_factory=list)
    failed: list[tuple[Call, BaseException]] = field(default_factory=list)
    encoded: bool = False  # it ran a prompt chunk or a turn's footer, not only decodes


class Core:
    """Owns the store, the message table and the model runner of one engine."""

    def __init__(
        self,
        weights: Weights,
        tokenizer,
        *,
        model_path: Path,
        mode: str = "choreographed",
        capacity: int = 32768,
        view_capacity: int | None = None,
        precision: str | None = None,
        contexts: str = "copy",
        attention: AttentionBackend | None = None,
    ) -> None:
        if mode not in MODES:
            raise InvalidRequest(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        if contexts not in CONTEXTS:
            raise InvalidRequest(f"contexts must be one of {', '.join(CONTEXTS)}, got {contexts!r}")
        spec = weights.spec
        self.mode = mode
        # the dtype name the engine was opened with ("mixed" is float32 weights)
        self.precision = precision or str(weights.dtype).removeprefix("torch.")
        self.model_path = model_path
        self.tokenizer = tokenizer
        self.fmt = ChatFormat(tokenizer)
        dims = dict(
            num_layers=spec.num_layers,
            num_kv_heads=spec.num_kv_heads,
            head_dim=spec.head_dim,
            capacity=capacity,
            dtype=weights.dtype,
            device=weights.device,
        )
        self.device = weights.device
        self.store = KVStore(**dims)
        # Room for the views of in-flight calls (each context once + their new tokens).
        # Views never spill outside it: a call that does not fit waits (ViewsFull). Sized
        # like the store by default, so any call that fits the store fits it alone.
        self.arena = ViewArena(**{**dims, "capacity": view_capacity or capacity})
        # Rotated contexts, each held once for every concurrent call that reads it.
        self.contexts = ContextPool()
        attention = attention or select_backend(weights.device)
        self.runner = ModelRunner(weights, self.store, attention)
        # contexts="store": a one-layer scratch holds each live context's rotated keys of
        # the layer being run (1/L of a copy); nothing else is held beside the store.
        self.context_mode = contexts
        self.scratch: ViewArena | None = None
        if contexts == "store":
            if self.runner.attention.name != "torch":
                raise InvalidRequest(
                    f'contexts="store" needs the torch attention backend, not '
                    f"{self.runner.attention.name!r} (set attention='torch')"
                )
            self.scratch = ViewArena(**{**dims, "num_layers": 1})
        self.scratch_tokens_peak = 0
        self.rope = weights.rope
        self.max_positions = min(spec.max_positions, weights.rope.max_positions)
        self.table = MessageTable()
        self.planner = Planner(
            self.fmt,
            self.table,
            mode=mode,
            max_positions=self.max_positions,
            vocab_size=spec.vocab_size,
        )
        self.radix = RadixCache() if mode == "baseline" else None
        self._uids = itertools.count(1)
        self._filling: list[Call] = []  # baseline: calls whose prompt is not all cached yet
        self._running_uids: set[int] = set()  # baseline: uids of admitted, unfinished calls
        self._failed: set[int] = set()  # baseline: failed calls whose inserts are still read
        self.tokens_shared_in_batch = 0
        self.own_view_tokens = 0  # tokens of admitted calls' own view parts
        self.view_tokens_peak = 0
        self.tokens_encoded = 0
        self.tokens_reused = 0
        self.forward_seconds = 0.0  # time spent in the model's forward
        # Guards slot and pin bookkeeping: `free` runs on the caller's thread while a
        # call may be running on the worker thread.
        self._mutex = threading.RLock()
        self.sink = self._make_sink()
        if self.sink is not None:
            self.planner.sink_slots = list(self.table.get(self.sink.id).slots)

    # ---- public operations (called from one worker thread at a time) ----

    def prefill_many(
        self, requests: Sequence[PrefillRequest], *, want_logits: bool = False
    ) -> tuple[list[Handle], list[Tensor] | None]:
        """Encode messages that do not attend to each other, fused; all or nothing.

        With want_logits, also returns each message's logits (own tokens x V).
        """
        calls = self._run_all([(r, want_logits) for r in requests], None)
        logits = [torch.cat(c.logits) for c in calls] if want_logits else None
        return [self.finish(c) for c in calls], logits

    def decode_many(
        self, requests: Sequence[DecodeRequest], on_token: TokenCallback | None = None
    ) -> list[Handle]:
        """Generate messages in parallel, fused; all or nothing. Tokens interleave in the store."""
        calls = self._run_all([(r, False) for r in requests], on_token)
        return [self.finish(c) for c in calls]

    def _run_all(self, requests, on_token: TokenCallback | None) -> list[Call]:
        calls: list[Call | None] = [None] * len(requests)
        waiting = list(range(len(requests)))
        try:
            while True:
                for i in list(waiting):  # baseline may hold a call until a shared prefix is in
                    req, want = requests[i]
                    try:
                        calls[i] = self.admit(req, want_logits=want, hold=True)
                    except CacheFullError as exc:  # wait while running calls may give room
                        running = any(c is not None and not c.done for c in calls)
                        if isinstance(exc, StoreTooSmall) or not running:
                            raise
                        break  # first come, first served: the rest wait behind it
                    if calls[i] is not None:
                        waiting.remove(i)
                active = [c for c in calls if c is not None and not c.done]
                if not active and not waiting:
                    return calls
                out = self.step(active, budget=None)
                if out.failed:
                    raise out.failed[0][1]
                if on_token is not None:
                    for c, tok in out.tokens:
                        on_token(calls.index(c), tok)
        except BaseException:
            for c in calls:
                if c is not None:
                    self.abort(c)
            raise

    # ---- the step machine (driven by _run_all or by the scheduler) ----

    def admit(
        self,
        request: PrefillRequest | DecodeRequest,
        *,
        want_logits: bool = False,
        hold: bool = False,
    ) -> Call | None:
        """Check and plan a call, reserve its slots and gather its view. Atomic.

        With `hold` (baseline), returns None instead when the call's prompt shares
        HOLD_MIN_SHARED or more uncached tokens with a running call's prompt: admit
        it again after a step, and it reuses that encoding instead of repeating it.
        Only calls still encoding their prompt (`_filling`, all of them admitted and
        stepped by the same caller) are waited for, so a hold always ends.
        """
        if isinstance(request, DecodeRequest):
            call = self.planner.decode(request)
        else:
            call = self.planner.prefill(request)
        call.want_logits = want_logits
        if self.mode != "choreographed" and not call.is_decode and not want_logits:
            call.done = call.text_only = True  # baseline / hf prefill stores text only
            return call
        if self.mode == "hf":
            return call  # run by transformers generate: no slots, no view
        if hold and self._waits(call):
            return None
        self._check_fits(call)
        try:
            self._take_slots([call])
            extra = len(call.feed) + _generated_max(call)
            call.view = CallView.gather(
                self.store,
                self.rope,
                call.ctx_slots,
                call.ctx_pos,
                extra,
                self.arena,
                fill=self.runner.attention.gather,
                pool=self.contexts,
                scratch=self.scratch,
            )
        except BaseException:
            self.abort(call)
            raise
        call.reused = len(call.ctx_slots)
        self.tokens_reused += call.reused
        with self._mutex:
            self.own_view_tokens += call.view.capacity
            self.view_tokens_peak = max(self.view_tokens_peak, self.view_tokens)
            self.scratch_tokens_peak = max(self.scratch_tokens_peak, self.scratch_tokens)
        return call

    @property
    def view_tokens(self) -> int:
        """Tokens held in views: every live context once, plus each call's own part."""
        return self.own_view_tokens + self.contexts.tokens

    def reset_peaks(self) -> None:
        """Peaks start over from what is held now (`Engine.reset_peak_stats`)."""
        with self._mutex:
            self.view_tokens_peak = self.view_tokens
            self.scratch_tokens_peak = self.scratch_tokens

    @property
    def scratch_tokens(self) -> int:
        """Tokens of one layer that contexts read from the store hold (contexts="store")."""
        s = self.scratch
        return s.capacity - s.free_tokens if s is not None else 0

    def drop_memory(self) -> None:
        """Give the store's, the arena's and the scratch's tensors back (the engine closed)."""
        self.store.drop()
        self.arena.drop()
        if self.scratch is not None:
            self.scratch.drop()

    def step(self, calls: Sequence[Call], budget: int | None) -> StepOutput:
        """One fused forward: a token for every decoding call, then prefill chunks.

        Decoding calls go first, so a long prefill never starves them; prefill
        chunks (at most PREFILL_CHUNK tokens each) fill what is left of `budget`
        tokens, in the order given, and always get 1/PREFILL_SHARE of it when any
        call is prefilling (so decodes never starve prefills either). A call that
        fails here (its sampling) is rolled back and reported in `failed`; the
        others go on.
        """
        out = StepOutput()
        plan: list[tuple[Call, int, int]] = []  # (call, first feed index or -1, n tokens)
        left = budget if budget is not None else 1 << 62
        prefilling = sum(len(c.feed) - c.fed for c in calls if c.pending is None)
        # Prefill chunks keep a share of every step, so a full batch of decodes never
        # starves them; decodes past the rest of the budget wait one step.
        decodes = left - min(prefilling, max(1, left // PREFILL_SHARE))
        for c in calls:
            if c.pending is None or decodes <= 0:
                continue
            # the pending token; a finishing call's footer goes with it, so its turn is
            # closed in one step (rows that need no logits need not wait for each other)
            n = 1 + len(c.closing)
            decodes -= n
            try:
                self._next_slots(c, n)
            except CacheFullError as exc:
                self.abort(c)
                out.failed.append((c, exc))
                continue
            plan.append((c, -1, n))
            left -= n
        for c in calls:
            if c.pending is None and c.fed < len(c.feed) and left > 0:
                n = min(len(c.feed) - c.fed, PREFILL_CHUNK, left)
                plan.append((c, c.fed, n))
                left -= n
        if not plan:
            return out
        out.encoded = any(start >= 0 or c.finishing for c, start, _ in plan)
        logits, rows = self._forward(plan)
        picks = self._picks(plan, rows, logits)
        r = 0
        for (c, start, n), k in zip(plan, rows, strict=True):
            pick = picks.get(r + k - 1) if k else None
            self._advance(c, start, n, logits[r : r + k], out, pick)
            r += k
            if c.done:  # its view and unused reservations go now, for waiting calls
                self._drop_view(c)
                self._release_spare(c)
        return out

    def _forward(self, plan: list[tuple[Call, int, int]]) -> tuple[Tensor, list[int]]:
        """Run the plan's rows; returns the logit rows (N, V) and each entry's count.

        Twin calls (`_twin_key`: the same shared context, the same first chunk at the
        same positions, as sixteen voters' headers over one set of branches) are
        encoded once: the first runs, the others copy its K/V and share its logits,
        and count those tokens as reused. In-batch prefix sharing does the same for
        the baseline's identical prompts."""
        ids, pos, slots, spans, rows, counts, t = [], [], [], [], [], [], 0
        leaders: dict[tuple, tuple[Call, list[int]]] = {}
        twins: list[tuple[Call, Call, int]] = []  # (twin, the call it copies, tokens)
        for c, start, n in plan:
            key = self._twin_key(c, start, n)
            if key in leaders:
                lead, lead_rows = leaders[key]
                twins.append((c, lead, n))
                c.reused += n
                self.tokens_reused += n
                rows += lead_rows
                counts.append(len(lead_rows))
                continue
            if start < 0:  # the pending sampled token, then a finishing call's footer
                first = c.feed_start + len(c.feed) + len(c.generated) + len(c.closed) - 1
                ids += [c.pending, *c.closing]  # n tokens
                pos += range(first, first + n)
                slots += c.slots[len(c.slots) - n :]
                mine = [] if c.finishing else [t]
            else:
                ids += c.feed[start : start + n]
                pos += range(c.feed_start + start, c.feed_start + start + n)
                slots += c.slots[start : start + n]
                mine = self._feed_rows(c, start, n, t)
                if key is not None:
                    leaders[key] = (c, mine)
            spans.append(SeqSpan(t, t + n, c.view))
            c.encoded += n
            rows += mine
            counts.append(len(mine))
            t += n
        dev = self.device
        batch = ForwardBatch(
            _long(ids, dev), _long(pos, dev), _long(slots, dev), tuple(spans), _long(rows, dev)
        )
        t0 = time.perf_counter()
        logits = self.runner.forward(batch)  # (len(rows), V)
        for c, lead, n in twins:
            self.store.copy(_long(lead.slots[:n], dev), _long(c.slots[:n], dev))
            c.view.copy_own(lead.view, n)
        self.forward_seconds += time.perf_counter() - t0
        self.tokens_encoded += t
        return logits, counts

    @staticmethod
    def _twin_key(c: Call, start: int, n: int) -> tuple | None:
        """What makes a decode's first chunk encode exactly as another's: the same
        shared context (one object: the same slots at the same positions), nothing of
        its own yet, the same tokens at the same positions. None: not a candidate.
        A twin's copy depends only on what the twin itself reads, so it carries no
        other agent's context (nothing for the leak policy to see)."""
        v = c.view
        if start != 0 or not c.is_decode or c.want_logits or v is None or v.ctx is None:
            return None
        if v.own_length or v.ctx.key is None:
            return None
        return (id(v.ctx), c.feed_start, n, tuple(c.feed[:n]))

    def _feed_rows(self, c: Call, start: int, n: int, t: int) -> list[int]:
        """Rows of a feed chunk whose logits the call needs."""
        if c.want_logits:
            own_from = len(c.feed) - c.own
            return list(range(t + max(start, own_from) - start, t + n))
        if c.is_decode and start + n == len(c.feed):
            return [t + n - 1]
        return []

    @staticmethod
    def _picks(plan, rows: list[int], logits: Tensor) -> dict[int, int]:
        """Logit row -> drawn token for the step's decodes that pick one now: one argmax
        over the greedy ones' rows (a per-call argmax over the vocabulary cost ~60 us)
        and one batched draw for the sampled ones (each from its own generator, so it
        draws what it would alone). Forced calls are in: they do the work of the calls
        they replay. A row missing (its logits not finite, or the batched draw
        failed) samples alone in `_advance`, where an error fails that call only."""
        greedy, sampled, r = [], [], 0
        for (c, _, _), k in zip(plan, rows, strict=True):
            r += k
            if not (k and c.is_decode):
                continue
            if c.sampling.greedy:
                greedy.append(r - 1)
            else:  # a finishing call's closing step has no logit row: it never gets here
                sampled.append((r - 1, c))
        picks = dict(zip(greedy, argmax_rows(logits[greedy]), strict=True)) if greedy else {}
        if sampled:
            at = [i for i, _ in sampled]
            params, gens = [c.sampling for _, c in sampled], [c.generator for _, c in sampled]
            try:
                drawn = sample_rows(logits[at], params, gens)
            except Exception:  # each samples alone in _advance: an error fails that call only
                drawn = [None] * len(at)
            picks |= {i: t for i, t in zip(at, drawn, strict=True) if t is not None}
        return picks

    def _advance(
        self, c: Call, start: int, n: int, logits: Tensor, out: StepOutput, pick: int | None
    ) -> None:
        if start < 0:
            c.pending = None
            if c.finishing:  # its last token and footer are encoded: the turn is closed
                c.closed += c.closing
                c.closing = []
                c.done = True
                return
        else:
            c.fed += n
            if c.uid:
                self._cache_fed(c)
            if c.want_logits:
                c.logits.append(logits)
            if c.fed < len(c.feed):
                return
            if not c.is_decode:
                c.done = True
                return
        try:
            tok = (
                forced(c.sampling, len(c.generated), pick)
                if pick is not None
                else sample(logits[-1], c.sampling, c.generator, len(c.generated))
            )
        except Exception as exc:  # a sampling error fails this call only
            self.abort(c)
            out.failed.append((c, exc))
            return
        c.generated.append(tok)
        c.pending = tok
        c.finishing = self._stops(c, tok)
        if c.finishing:
            c.closing = self._closing(c.footer, tok)
            if self.radix is not None:
                # The baseline re-encodes a turn's text wherever it is read, so it never
                # runs the last token and footer through the model (a serving engine's
                # prefix cache keeps a finished request's prompt and output but its last
                # token): the call is done. Choreography must encode them, as the message.
                c.closed, c.closing, c.pending, c.done = c.closing, [], None, True
        out.tokens.append((c, tok))

    def finish(self, c: Call) -> Handle:
        """Register a done call's message and return its handle."""
        assert c.done, "finish() needs a call whose step machine is done"
        handle = self._finish_decode(c) if c.is_decode else self._finish_prefill(c)
        self._drop_view(c)
        self._release_spare(c)
        return handle

    def _next_slots(self, c: Call, n: int) -> None:
        """n more store slots for the call's next tokens: its reservation first."""
        take = min(n, len(c.spare))
        if take:
            c.slots += reversed(c.spare[len(c.spare) - take :])
            del c.spare[len(c.spare) - take :]
        if n > take:
            c.slots += self._alloc(n - take, "a next token")

    def _release_spare(self, c: Call) -> None:
        if c.spare:
            with self._mutex:
                self.store.release(c.spare)
                c.spare = []

    def _check_fits(self, c: Call) -> None:
        """StoreTooSmall if the call could not run even in an otherwise empty store."""
        prompt = len(c.prefix) if self.mode != "choreographed" else len(c.ctx_slots) + len(c.feed)
        need = prompt + _generated_max(c)  # store slots, and view tokens alike
        room, where = min((self.store.capacity, "store"), (self.arena.capacity, "view arena"))
        if need > room:
            raise StoreTooSmall(
                f"this {c.kind} call needs {need} token slots (prompt {prompt} + up to "
                f"{need - prompt} generated) but the whole {where} has {room}; "
                f"lower max_tokens or open the engine with a larger capacity / memory_budget"
            )

    def _drop_view(self, c: Call) -> None:
        if c.view is not None:
            with self._mutex:
                c.view.release()
                self.own_view_tokens -= c.view.capacity
            c.view = None

    def abort(self, c: Call) -> None:
        """Give back everything a call holds; the store is as if it never ran."""
        self._rollback([c])
        self._drop_view(c)
        c.done = True

    def pin(self, handles: Sequence[Handle]) -> list[Message]:
        """Keep these messages' encodings until `unpin`, even if freed meanwhile."""
        with self._mutex:
            msgs = [self.table.live(h.id) for h in handles]
            for m in msgs:
                m.pins += 1
            return msgs

    def unpin(self, msgs: Sequence[Message]) -> None:
        with self._mutex:
            for m in msgs:
                m.pins -= 1
                if m.freed and m.pins == 0:
                    self._release_message(m)

    def free(self, handle: Handle) -> None:
        with self._mutex:
            self._live(handle)  # a handle of this engine
            msg = self.table.live(handle.id)  # not freed yet
            if msg.kind == "sink":
                raise InvalidRequest("the attention sink cannot be freed")
            msg.freed = True
            if msg.pins == 0:
                self._release_message(msg)

    def stats(self) -> EngineStats:
        radix = self.radix
        return EngineStats(
            mode=self.mode,
            capacity=self.store.capacity,
            tokens_used=self.store.used_slots,
            tokens_free=self.store.free_slots,
            messages=len(self.table) - (1 if self.sink is not None else 0),
            tokens_encoded=self.tokens_encoded,
            tokens_reused=self.tokens_reused,
            prefix_hit_tokens=radix.hit_tokens if radix else 0,
            prefix_query_tokens=radix.query_tokens if radix else 0,
            prefix_shared_in_batch=self.tokens_shared_in_batch,
            view_tokens=self.view_tokens,
            view_tokens_peak=self.view_tokens_peak,
            view_capacity=self.arena.capacity,
            kv_bytes=self.kv_bytes,
            contexts=self.context_mode,
            scratch_tokens=self.scratch_tokens,
            scratch_tokens_peak=self.scratch_tokens_peak,
            layers=self.store.k.shape[0],
            weight_bytes=self.runner.w.nbytes,
            forward_s=self.forward_seconds,
        )

    @property
    def kv_bytes(self) -> int:
        """All the KV memory the engine can use: the store, the view arena and the
        one-layer context scratch (contexts="store")."""
        per = self.store.bytes_per_slot
        scratch = self.scratch.capacity * per // self.store.k.shape[0] if self.scratch else 0
        return (self.store.capacity + self.arena.capacity) * per + scratch

    # ---- planning ----

    def _make_sink(self) -> Handle | None:
        if self.mode != "choreographed" or not self.fmt.sink:
            return None
        sink = list(self.fmt.sink)
        call = Call(
            ctx_slots=[],
            ctx_pos=[],
            feed=sink,
            feed_start=0,
            own=len(sink),
            role="sink",
            text="",
            kind="sink",
            offset=0,
            parents=(),
            parent_offsets=(),
            owner=None,
            visibility=None,
            prefix=list(sink),
        )
        self._take_slots([call])
        call.view = CallView.gather(self.store, self.rope, [], [], len(sink))
        self.own_view_tokens += call.view.capacity  # given back when it finishes
        while not call.done:
            self.step([call], budget=None)
        return self.finish(call)

    def _live(self, handle: Handle) -> Message:
        return self.planner.live(handle)

    # ---- running ----

    def _take_slots(self, calls: list[Call]) -> None:
        """Pin parents, reuse cached prefixes (baseline) and reserve slots for every feed."""
        with self._mutex:
            self._take_slots_locked(calls)

    def _take_slots_locked(self, calls: list[Call]) -> None:
        for c in calls:
            for p in c.pinned:
                p.pins += 1
            c.pins_held = True
            if self.radix is not None:
                self._match_prefix(c)
        for c in calls:  # feed slots now, and the generated tokens' reserved up front
            n, extra = len(c.feed), _generated_max(c)
            got = self._alloc(n + extra, f"a {n}-token {c.kind} call (+{extra} to generate)")
            c.slots, c.spare = got[:n], got[n:]

    def _match_prefix(self, c: Call) -> None:
        match = self.radix.match(c.prefix)
        hit = min(match.length, len(c.prefix) - 1)  # re-encode >= 1 token to get logits
        self.radix.lock(match.node)
        c.lock = match.node
        c.ctx_slots, c.ctx_pos = match.slots[:hit], list(range(hit))
        c.feed, c.feed_start = c.prefix[hit:], hit
        seen = 0
        for creator, n in match.creators:  # hits a call still running encoded: in-batch
            if creator in self._running_uids:
                self.tokens_shared_in_batch += max(0, min(n, hit - seen))
            seen += n
        c.uid = next(self._uids)
        self._running_uids.add(c.uid)
        self._filling.append(c)

    # ---- in-batch prefix sharing (baseline) ----

    def _waits(self, c: Call) -> bool:
        """Whether c should wait for a running call that is encoding its prompt's prefix."""
        if not self._filling:
            return False
        cached = self.radix.peek(c.prefix)
        return any(
            _common_len(c.prefix, other.prefix) - cached >= HOLD_MIN_SHARED
            for other in self._filling
        )

    def _cache_fed(self, c: Call) -> None:
        """Put the prompt tokens c has encoded so far in the radix tree, for others to reuse.

        The tree owns those slots from now on (c keeps them locked while it runs);
        slots that another call had already cached are given back.
        """
        with self._mutex:
            end = c.feed_start + c.fed
            tokens, slots = c.prefix[:end], c.ctx_slots + c.slots[: c.fed]
            self.store.release(self.radix.insert(tokens, slots, creator=c.uid))
            match = self.radix.match(tokens, count=False)
            self.radix.lock(match.node)
            self.radix.unlock(c.lock)
            c.lock = match.node
            c.slots[: c.fed] = match.slots[len(c.ctx_slots) :]
            c.cached = c.fed
            if c.fed == len(c.feed):
                self._filling.remove(c)

    def _end_baseline(self, c: Call, *, failed: bool) -> None:
        """c is over: it no longer fills or shares. A failed call takes back what it
        inserted, except what a running call still reads: that goes when it is free."""
        if c in self._filling:
            self._filling.remove(c)
        self._running_uids.discard(c.uid)
        if failed:
            self._failed.add(c.uid)
        for uid in list(self._failed):
            self.store.release(self.radix.drop(uid))
            if not self.radix.holds(uid):
                self._failed.discard(uid)
        c.uid = 0

    def _alloc(self, n: int, request: str) -> list[int]:
        with self._mutex:
            short = n - self.store.free_slots
            if short > 0 and self.radix is not None:
                self.store.release(self.radix.evict(short))
            return self.store.alloc(n, request=request)

    def _stops(self, c: Call, tok: int) -> bool:
        if c.sampling.force:
            return len(c.generated) >= len(c.sampling.force)
        if len(c.generated) >= c.sampling.max_tokens:
            return True
        if tok in self.fmt.stop_ids and not c.sampling.ignore_eos:
            return True
        if c.sampling.stop:
            tail = self.fmt.decode(c.generated[-32:])
            return any(s in tail for s in c.sampling.stop)
        return False

    def _closing(self, footer: list[int], last: int) -> list[int]:
        """The footer tokens that close a turn whose last generated token is `last`.

        A turn that ended on the footer's own end-of-turn token gets the rest of the
        footer (SmolLM2: the newline after <|im_end|>); one cut by max_tokens or a stop
        string gets the whole footer, so later turns read the framing the model knows.
        """
        if last in self.fmt.stop_ids and last in footer:
            return footer[footer.index(last) + 1 :]
        return list(footer)

    # ---- finishing ----

    def _own(self, c: Call) -> list[int]:
        return c.prefix[len(c.prefix) - c.own :]

    def _finish_prefill(self, c: Call) -> Handle:
        if c.text_only:  # baseline / hf prefill
            return self._register(c, self._own(c), [])
        if self.radix is not None:
            self._cache_prefix(c, c.prefix)
            return self._register(c, self._own(c), [])
        return self._register(c, c.feed, c.slots)

    def _finish_decode(self, c: Call) -> Handle:
        tokens = self._own(c) + c.generated
        c.text = self._decoded_text(tokens[c.frame_len :], c.sampling)
        tokens += c.closed
        if self.radix is not None:  # its last generated token was never encoded
            self._cache_prefix(c, c.prefix + c.generated[:-1])
            return self._register(c, tokens, [])
        return self._register(c, tokens, c.slots)

    def _decoded_text(self, tokens: list[int], sampling: SamplingParams) -> str:
        text = self.fmt.decode([t for t in tokens if t not in self.fmt.stop_ids])
        cuts = [text.find(s) for s in sampling.stop if s in text]
        return text[: min(cuts)] if cuts else text

    def _cache_prefix(self, c: Call, tokens: list[int]) -> None:
        with self._mutex:
            self._cache_prefix_locked(c, tokens)

    def _cache_prefix_locked(self, c: Call, tokens: list[int]) -> None:
        slots = c.ctx_slots + c.slots
        self.store.release(self.radix.insert(tokens, slots, creator=c.uid or None))
        self.radix.unlock(c.lock)
        c.lock, c.slots = None, []
        self._end_baseline(c, failed=False)
        self._unpin(c)

    def _register(self, c: Call, tokens: list[int], slots: list[int]) -> Handle:
        mid = self.table.next_id()
        self.table.add(
            Message(
                mid,
                list(tokens),
                c.text,
                c.role,
                c.kind,
                list(slots),
                c.offset,
                c.parents,
                c.parent_offsets,
                c.owner,
                c.visibility,
                sources=self._sources(c.parents),
            )
        )
        msg = self.table.get(mid)
        msg.extra["tokens_encoded"] = c.encoded
        msg.extra["tokens_reused"] = c.reused
        if c.is_decode:
            msg.extra["generated_from"] = c.own
            msg.extra["generated"] = len(c.generated)
        c.slots = []  # the message owns them now; an abort must not release them
        self._unpin(c)
        return Handle(mid, self.table)

    def _sources(self, parents: tuple[int, ...]) -> frozenset[int]:
        """What a new encoding attends to: its parents and (choreographed) their sources.

        In baseline mode parents are re-encoded from their text inside the call,
        so only the parents themselves are attended to.
        """
        if self.mode != "choreographed":
            return frozenset(parents)
        out: set[int] = set(parents)
        for p in parents:
            out |= self.table.get(p).sources
        return frozenset(out)

    def _unpin(self, c: Call) -> None:
        with self._mutex:
            if not c.pins_held:
                return
            for p in c.pinned:
                p.pins -= 1
                if p.freed and p.pins == 0:
                    self._release_message(p)
            c.pins_held = False

    def _rollback(self, calls: list[Call]) -> None:
        with self._mutex:
            self._rollback_locked(calls)

    def _rollback_locked(self, calls: list[Call]) -> None:
        for c in calls:
            if c.slots:
                self.store.release(c.slots[c.cached :])  # the tree owns the cached ones
                c.slots = []
            if c.spare:
                self.store.release(c.spare)
                c.spare = []
            if c.lock is not None:
                self.radix.unlock(c.lock)
                c.lock = None
            if c.uid:
                self._end_baseline(c, failed=True)
            self._unpin(c)

    def _release_message(self, msg: Message) -> None:
        self.store.release(msg.slots)
        msg.slots = []


def _generated_max(c: Call) -> int:
    """Slots a call may still need beyond its feed: every token it may generate, and
    its closing footer (reserved at admission, so it never runs out mid-generation)."""
    return c.sampling.max_tokens + len(c.footer) if c.is_decode else 0


def _common_len(a: list[int], b: list[int]) -> int:
    n, limit = 0, min(len(a), len(b))
    while n < limit and a[n] == b[n]:
        n += 1
    return n


def _long(values, device: torch.device) -> Tensor:
    """Index tensors are made on the store's device (index_copy_ / index_select need it)."""
    return torch.tensor(values, dtype=torch.long, device=device)
