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

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from corps.cache.arena import ViewArena
from corps.cache.errors import CacheFullError
from corps.cache.handle import Handle
from corps.cache.kv import KVStore
from corps.cache.messages import Message, MessageTable
from corps.cache.rewired import rewired
from corps.engine.attention import AttentionBackend, select_backend
from corps.engine.config import CONTEXTS, MODES
from corps.engine.errors import InvalidRequest
from corps.engine.exec.advance import advance
from corps.engine.exec.batch import PlanEntry, build_batch, logit_rows, long_tensor, samples
from corps.engine.exec.call import Call, CallPlan
from corps.engine.exec.draw import bias
from corps.engine.exec.finish import finish_decode, finish_prefill, make_sink
from corps.engine.exec.grammars import Grammars
from corps.engine.exec.grammars import apply as apply_masks
from corps.engine.exec.memory import Memory, Victims
from corps.engine.exec.planner import Planner
from corps.engine.exec.recompute import restore
from corps.engine.exec.repair_rows import plan_repair, probe, rewired_ranges
from corps.engine.exec.sampler import Sampler
from corps.engine.exec.step_plan import (
    PENDING,
    REPAIR,
    StepOutput,
    StepPlan,
    decode_keys,
    plan_rows,
)
from corps.engine.model.runner import ModelRunner
from corps.engine.model.tuning import KernelChoice
from corps.engine.model.weights import Weights
from corps.engine.repair import NONE, Repair
from corps.engine.request.chat import ChatFormat
from corps.engine.request.requests import DecodeRequest, PrefillRequest
from corps.engine.stats import EngineStats


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
        jump_forward: bool = True,
    ) -> None:
        if mode not in MODES or mode == "hf":
            raise InvalidRequest(
                f"Core runs choreographed or baseline, got {mode!r} (hf: corps.engine.exec.hf)"
            )
        if contexts not in CONTEXTS:
            raise InvalidRequest(f"contexts must be one of {', '.join(CONTEXTS)}, got {contexts!r}")
        spec = weights.spec
        self.mode = mode
        # the product kernels measured on this CPU (dtype auto), set by the builder
        self.kernel_choice: KernelChoice | None = None
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
        attention = attention or select_backend(weights.device)
        self.runner = ModelRunner(weights, self.store, attention)
        # contexts="store": a one-layer scratch holds each live context's rotated keys of
        # the layer being run (1/L of a copy); nothing else is held beside the store.
        self.context_mode = contexts
        scratch: ViewArena | None = None
        if contexts == "store":
            if self.runner.attention.name != "torch":
                raise InvalidRequest(
                    f'contexts="store" needs the torch attention backend, not '
                    f"{self.runner.attention.name!r} (set attention='torch')"
                )
            scratch = ViewArena(**{**dims, "num_layers": 1})
        self.rope = weights.rope
        self.max_positions = min(spec.max_positions, weights.rope.max_positions)
        self.table = MessageTable()
        self.memory = Memory(
            self.store,
            self.arena,
            scratch,
            self.table,
            self.rope,
            self.runner.attention.gather,
            shared_prefixes=mode == "baseline",
        )
        self.prefixes = self.memory.prefixes  # the baseline's radix tree (None: choreographed)
        self.sampler = Sampler(self.fmt)
        self.grammars = Grammars(self.fmt.tokenizer, self.fmt.stop_ids)
        self.grammars.warm()  # the first constrained call does not pay for its tokenizer
        self.planner = Planner(
            self.fmt,
            self.table,
            mode=mode,
            max_positions=self.max_positions,
            vocab_size=spec.vocab_size,
        )
        self.tokens_encoded = 0
        self.tokens_reused = 0
        self.tokens_jumped = 0  # tokens constraints forced, appended without sampling
        self.tokens_recomputed = 0  # tokens of evicted encodings made again (`restore`)
        self.repair = NONE  # the repair of calls that name none (EngineConfig.repair)
        self.tokens_repaired = 0  # rewired context tokens recomputed (`exec.repair_rows`)
        self.tokens_probed = 0  # rewired tokens the repair's deviation probe ran
        self.jump_forward = jump_forward
        self.forward_seconds = 0.0  # time spent in the model's forward
        self.sink = make_sink(self)
        if self.sink is not None:
            self.planner.sink_slots = list(self.table.get(self.sink.id).slots)

    # ---- the step machine (driven by the scheduler) ----

    def admit(
        self,
        request: PrefillRequest | DecodeRequest,
        *,
        want_logits: bool = False,
        hold: bool = False,
        evict: Victims | None = None,
    ) -> Call | None:
        """Check and plan a call, reserve its slots and gather its view. Atomic.

        With `hold` (baseline), returns None instead when the call's prompt shares
        HOLD_MIN_SHARED or more uncached tokens with a running call's prompt: admit
        it again after a step, and it reuses that encoding instead of repeating it
        (`PrefixSharing.waits`).

        Parents whose encodings were evicted are recomputed first (`restore`); with
        `evict` (a victim order), encodings no running call reads may be dropped to
        make room (`Memory.evict`). A call that fails leaves every message readable as
        it was: parents it recomputed keep their (identical) encodings, and encodings
        it evicted stay evicted (recomputed when read).
        """
        if self.mode == "choreographed":
            self.restore(request.parents, evict)
        request = self.laid_out(request)
        if isinstance(request, DecodeRequest):
            call = self.planner.decode(request)
            if request.sampling.constraint is not None:
                call.matcher = self.grammars.matcher(request.sampling.constraint)
        else:
            call = self.planner.prefill(request)
        call.want_logits = want_logits
        call.adapted = self.adapted(call.plan)
        if self.prefixes is not None and not call.plan.is_decode and not want_logits:
            call.done = call.text_only = True  # a baseline prefill stores its text only
            return call
        if hold and self.prefixes is not None and self.prefixes.waits(call):
            return None
        baseline = self.prefixes is not None
        prompt = len(call.plan.prefix) if baseline else len(call.ctx_slots) + len(call.feed)
        self.memory.check_fits(call, prompt, call.plan.generated_max)
        repair = self.repair_of(request, call)
        try:
            self.memory.reserve(call, call.plan.generated_max, evict)
            self.memory.gather(call, len(call.feed) + call.plan.generated_max, own=not repair.none)
            if not repair.none:
                call.repair = plan_repair(self, call, repair)
        except BaseException:
            self.abort(call)
            raise
        call.reused = len(call.ctx_slots) - call.repaired
        self.tokens_reused += call.reused
        self.tokens_repaired += call.repaired
        self.tokens_probed += call.repair.probed if call.repair is not None else 0
        return call

    def laid_out(self, request: PrefillRequest | DecodeRequest) -> PrefillRequest | DecodeRequest:
        """The request as it runs: under a `serial` repair (`Repair.serial`, choreographed
        mode), its parents end to end from where it puts the first, its message right
        after them; else as it is."""
        if not self.requested(request).serial or self.mode != "choreographed":
            return request
        first = request.offsets[0] if request.offsets else None
        offsets = [first] + [None] * (len(request.parents) - 1) if request.parents else None
        return dataclasses.replace(request, offsets=offsets, new_offset=None)

    def requested(self, request: PrefillRequest | DecodeRequest) -> Repair:
        """The repair a request names (its agent's or workflow's filled in at
        submission), else the engine's."""
        return request.repair if request.repair is not None else self.repair

    def repair_of(self, request: PrefillRequest | DecodeRequest, call: Call) -> Repair:
        """The repair a call gets (`corps.engine.repair`): its request's, else
        the engine's; none in baseline mode (nothing is rewired) and for a call whose
        context is a chain."""
        repair = self.requested(request)
        if repair.none or self.mode != "choreographed" or call.plan.kind == "sink":
            return NONE
        return repair if rewired_ranges(self, call) else NONE

    def use_graphs(self, how: str) -> None:
        """Run decode-only steps over static buffers (`EngineConfig.graphs`): "capture"
        (CUDA graphs), "static" (the same buffers, eagerly) or "off"."""
        from corps.engine.model.static_decode import StaticDecode

        self.runner.static = (
            None
            if how == "off"
            else StaticDecode(self.runner, self.arena, capture=how == "capture")
        )

    def reset_peaks(self) -> None:
        """Peaks start over from what is held now (`Engine.reset_peak_stats`)."""
        self.memory.reset_peaks()

    def step(self, plan: StepPlan) -> StepOutput:
        """Run one step's plan (`corps.engine.exec.step_plan`): take the slots its decoding
        calls' rows need, run every row in one fused forward, sample, and advance the
        calls. A call that fails here (its slots or its sampling) is rolled back and
        reported in `failed`; the others go on."""
        out = StepOutput()
        entries = self._allocate(plan, out)
        if entries:
            self._run(entries, out)
        return out

    def _allocate(self, plan: StepPlan, out: StepOutput) -> list[PlanEntry]:
        """Store slots for the decoding calls' rows (their reservations first); the
        plan's entries whose calls got them, as (call, first feed index or -1, n)."""
        entries: list[PlanEntry] = []
        for e in plan.entries:
            if e.is_decode:
                try:
                    self.memory.next_slots(e.call, e.n)
                except CacheFullError as exc:
                    self.abort(e.call)
                    out.failed.append((e.call, exc))
                    continue
            entries.append((e.call, e.start, e.n))
        return entries

    def _run(self, plan: list[PlanEntry], out: StepOutput) -> None:
        """The forward over the plan's rows, the sampling, and each call's advance."""
        for c, start, n in plan:
            if start != REPAIR:  # the spans its message was encoded in (a recompute's)
                c.spans.append(n)
        out.calls, out.rows = len(plan), sum(n for _, _, n in plan)
        out.chunks = sum(start >= 0 for _, start, _ in plan)
        out.keys = decode_keys([c.next_keys for c, s, n in plan if n == 1 and s == PENDING])
        out.encoded = any(start != PENDING or c.finishing for c, start, _ in plan)
        # constrained calls' masks are computed on another thread while the forward runs
        constrained = [c for c, start, n in plan if c.matcher is not None and samples(c, start, n)]
        masks = self.grammars.masks_async([c.matcher for c in constrained]) if constrained else None
        probe(self, [c for c, start, _ in plan if start == REPAIR])  # their rows, chosen now
        logits, rows = self._forward(plan)
        sampling_rows = logit_rows(plan, rows)
        for c, r in sampling_rows:  # the model's own distribution, before any mask
            if c.plan.sampling.logprobs:
                c.scores = torch.log_softmax(logits[r].float(), dim=-1)  # (V,)
        bias(logits, [(r, c.plan.sampling) for c, r in sampling_rows if c.plan.sampling.logit_bias])
        if masks is not None:
            row_of = {id(c): r for c, r in sampling_rows}
            apply_masks(logits, [row_of[id(c)] for c in constrained], masks.result())
        picks = self.sampler.picks(sampling_rows, logits)
        r = 0
        for (c, start, n), k in zip(plan, rows, strict=True):
            pick = picks.get(r + k - 1) if k else None
            advance(self, c, start, n, logits[r : r + k], out, pick)
            r += k
            if c.done:  # its view and unused reservations go now, for waiting calls
                self.memory.drop_view(c)
                self.memory.release_spare(c)

    def run_alone(self, call: Call) -> None:
        """Step `call` alone until it is done (the attention sink, a recompute), each
        step planned as the loop plans one (`plan_rows`); raises what failed it."""
        while not call.done:
            out = self.step(plan_rows([call]))
            if out.failed:
                raise out.failed[0][1]

    def _forward(self, plan: list[PlanEntry]) -> tuple[Tensor, list[int]]:
        """Run the plan's rows; returns the logit rows (N, V) and each entry's count.
        Twin calls (`corps.engine.exec.batch`) copy their leader's K/V after the forward."""
        batch = build_batch(plan, self.device)
        self.tokens_reused += batch.twin_tokens
        t0 = time.perf_counter()
        logits = self.runner.forward(batch.forward)  # (len(rows), V)
        for c, lead, n in batch.twins:
            dev = self.device
            self.store.copy(long_tensor(lead.slots[:n], dev), long_tensor(c.slots[:n], dev))
            c.view.copy_own(lead.view, n)
        self.forward_seconds += time.perf_counter() - t0
        self.tokens_encoded += batch.forward.input_ids.numel()
        return logits, batch.counts

    # ---- preemption ----

    def restore(self, parents: Sequence[Handle], evict: Victims | None = None) -> None:
        """Recompute the encodings of evicted messages among `parents` before a call
        reads them (`corps.engine.exec.recompute`)."""
        restore(self, parents, evict)

    def finish(self, c: Call) -> Handle:
        """Register a done call's message and return its handle."""
        assert c.done, "finish() needs a call whose step machine is done"
        handle = finish_decode(self, c) if c.plan.is_decode else finish_prefill(self, c)
        self.memory.drop_view(c)
        self.memory.release_spare(c)
        return handle

    def adapted(self, plan: CallPlan) -> bool:
        """Whether an adapter kept apart (scope "rewired", `model.adapter_rows`) applies
        to a call of this plan: a choreographed call whose context is rewired."""
        if (
            self.runner.w is None
            or self.runner.w.lora is None
            or self.mode != "choreographed"
            or plan.kind == "sink"
        ):
            return False
        start = len(self.fmt.sink)
        return rewired(plan.offset, plan.parents, plan.parent_offsets, self.table.get, start)

    def abort(self, c: Call) -> None:
        """Give back everything a call holds; the store is as if it never ran."""
        self.memory.rollback(c)
        self.memory.drop_view(c)
        c.done = True

    def pin(self, handles: Sequence[Handle]) -> list[Message]:
        """Keep these messages' encodings until `unpin`, even if freed meanwhile."""
        return self.memory.pin(handles)

    def unpin(self, msgs: Sequence[Message]) -> None:
        self.memory.unpin(msgs)

    def free(self, handle: Handle) -> None:
        with self.memory.lock:
            self.planner.live(handle)  # a handle of this engine
            msg = self.table.live(handle.id)  # not freed yet
            if msg.kind == "sink":
                raise InvalidRequest("the attention sink cannot be freed")
            self.memory.free(msg)

    def check(self) -> None:
        """BrokenInvariant unless the bookkeeping of an idle core is exact (`Memory.check`)."""
        self.memory.check()

    def occupancy(self) -> tuple[int, int]:
        """(store slots used, store capacity), for the loop's step events."""
        return self.store.used_slots, self.store.capacity

    def preempted(self) -> tuple[int, int]:
        """(tokens evicted, tokens recomputed) so far, for the loop's step events."""
        return self.memory.tokens_evicted, self.tokens_recomputed

    def close(self) -> None:
        """Give back every tensor the core allocated: the KV memory, the weights and the
        RoPE tables (the engine closed; its figures stay readable)."""
        self.memory.drop()
        self.grammars.close()
        self.runner.release()
        self.rope = self.memory.rope = None

    def stats(self) -> EngineStats:
        memory = self.memory
        radix = self.prefixes.radix if self.prefixes is not None else None
        graph, static = self.runner.compiled, self.runner.static
        return EngineStats(
            mode=self.mode,
            capacity=self.store.capacity,
            tokens_used=self.store.used_slots,
            tokens_free=self.store.free_slots,
            messages=len(self.table) - (1 if self.sink is not None else 0),
            tokens_encoded=self.tokens_encoded,
            tokens_reused=self.tokens_reused,
            tokens_jumped=self.tokens_jumped,
            constraints_compiled=len(self.grammars.compile_seconds),
            constraint_compile_s=sum(self.grammars.compile_seconds.values()),
            prefix_hit_tokens=radix.hit_tokens if radix else 0,
            prefix_query_tokens=radix.query_tokens if radix else 0,
            prefix_shared_in_batch=self.prefixes.shared_in_batch if self.prefixes else 0,
            view_tokens=memory.view_tokens,
            view_tokens_peak=memory.view_tokens_peak,
            view_capacity=self.arena.capacity,
            kv_bytes=memory.kv_bytes,
            contexts=self.context_mode,
            scratch_tokens=memory.scratch_tokens,
            scratch_tokens_peak=memory.scratch_tokens_peak,
            layers=self.store.k.shape[0],
            weight_bytes=self.runner.weight_bytes,
            forward_s=self.forward_seconds,
            compiled_steps=sum(graph.steps.values()) if graph else 0,
            static_steps=static.runs if static else 0,
            graphs_captured=sum(s.graph is not None for s in static.steps.values())
            if static
            else 0,
            graph_capture_s=static.capture_seconds if static else 0.0,
            step_compile_s=graph.compile_seconds if graph else 0.0,
            messages_evicted=memory.messages_evicted,
            tokens_evicted=memory.tokens_evicted,
            tokens_recomputed=self.tokens_recomputed,
            tokens_repaired=self.tokens_repaired,
            tokens_probed=self.tokens_probed,
            repair=str(self.repair),
        )
