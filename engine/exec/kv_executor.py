"""`KVExecutor`: the executor of choreographed and baseline modes, a coordinator of its parts.

Two modes share everything but planning:

- choreographed: a call's context is its parents' cached K/V, placed at the
  offsets the call gives; only the new message is encoded.
- baseline: a call renders its parents' tokens as one causal prompt; the
  longest cached prefix comes from a radix tree, the rest is encoded.

The parts, each the owner of what it changes: `Memory` (slots, views, pins,
rollback), `Planner` (requests to calls), `Repairs` (what a call recomputes of
its context), `Restorer` (evicted encodings made again), `Stepper` (one fused
forward, the draw, and `Postprocess`), `Finisher` (done calls to messages).

Every call is validated and planned before anything is computed, and every
slot it takes is given back if it fails, so a failed call leaves the store as
it was.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from pathlib import Path

from corps.cache.arena import ViewArena
from corps.cache.durable import DurableStore
from corps.cache.handle import Handle
from corps.cache.kv import KVStore
from corps.cache.messages import Message, MessageTable
from corps.engine.attention import AttentionBackend, select_backend
from corps.engine.config import CONTEXTS, MODES
from corps.engine.errors import InvalidRequest
from corps.engine.exec.baseline_work import BaselineWork, Work
from corps.engine.exec.call import Call
from corps.engine.exec.counts import Counts
from corps.engine.exec.engine_stats import engine_stats
from corps.engine.exec.finish import Finisher, encoded_reply, open_sink
from corps.engine.exec.grammars import Grammars
from corps.engine.exec.memory import Memory, Victims, scratch_arena
from corps.engine.exec.persist import checkpoint, restore
from corps.engine.exec.phases import phase
from corps.engine.exec.planner import Planner
from corps.engine.exec.postprocess import Postprocess
from corps.engine.exec.repairs import Repairs
from corps.engine.exec.restorer import Restorer
from corps.engine.exec.sampler import Sampler
from corps.engine.exec.step_plan import StepOutput, StepPlan, plan_rows
from corps.engine.exec.stepper import Stepper
from corps.engine.model.compiled_decode import compile_step
from corps.engine.model.precompiled_decode import precompiled_step
from corps.engine.model.runner import ModelRunner
from corps.engine.model.static_decode import use_graphs
from corps.engine.model.tuning import KernelChoice
from corps.engine.model.weights import Weights
from corps.engine.repair import NONE, Repair
from corps.engine.request.chat_format import ChatFormat
from corps.engine.request.requests import DecodeRequest
from corps.engine.stats import EngineStats


class KVExecutor:
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
        repair: Repair = NONE,
        repair_bound: bool = True,
        graphs: str = "off",
        compile_gemms: str | None = None,
        kernel_choice: KernelChoice | None = None,
        step_cache: Path | None = None,
        build_step: bool = False,
    ) -> None:
        if mode not in MODES or mode == "hf" or contexts not in CONTEXTS:
            raise InvalidRequest(
                f"KVExecutor runs mode choreographed or baseline (hf: corps.engine.exec.hf) with "
                f"contexts {' or '.join(CONTEXTS)}; got {mode!r} and {contexts!r}"
            )
        spec, choreo = weights.spec, mode == "choreographed"
        self.mode, self.model_path, self.tokenizer = mode, model_path, tokenizer
        # the dtype name the engine was opened with ("mixed" is float32 weights)
        self.precision = precision or str(weights.dtype).removeprefix("torch.")
        self.kernel_choice = kernel_choice  # the kernels measured on this CPU (dtype auto)
        self.fmt, self.device, self.context_mode = ChatFormat(tokenizer), weights.device, contexts
        dims = dict(num_layers=spec.num_layers, num_kv_heads=spec.num_kv_heads,
                    head_dim=spec.head_dim, capacity=capacity, dtype=weights.dtype,
                    device=weights.device)  # fmt: skip
        store = KVStore(**dims)
        # Room for the views of in-flight calls (each context once + their new tokens).
        # Views never spill outside it: a call that does not fit waits (ViewsFull). Sized
        # like the store by default, so any call that fits the store fits it alone.
        arena = ViewArena(**{**dims, "capacity": view_capacity or capacity})
        self.runner = runner = ModelRunner(weights, store, attention or select_backend(self.device))
        if compile_gemms is not None:  # EngineConfig.compile: the lone one-row decode step
            if contexts != "copy":
                raise InvalidRequest("compile=True needs contexts='copy', not 'store'")
            compile_step(runner, arena, compile_gemms)
        # EngineConfig.precompiled: the same step compiled ahead of time, if one is kept
        self.step_missing = (
            None if compile_gemms is not None or step_cache is None or contexts != "copy"
            else precompiled_step(runner, arena, step_cache, build_step)
        )  # fmt: skip
        use_graphs(runner, arena, graphs)
        # contexts="store": a one-layer scratch holds each live context's rotated keys of
        # the layer being run (1/L of a copy); nothing else is held beside the store.
        scratch = scratch_arena(dims, runner.attention.name) if contexts == "store" else None
        self.max_positions = min(spec.max_positions, weights.rope.max_positions)
        self.table = table = MessageTable()
        self.durable: DurableStore | None = None  # EngineConfig.store (`corps.cache.durable`)
        self.memory = memory = Memory(
            store,
            arena,
            scratch,
            table,
            weights.rope,
            runner.attention.gather,
            shared_prefixes=not choreo,
        )
        if choreo and store.k.device.type == "cuda":
            memory.use_host_tier()  # evicted encodings to host memory, not recomputed
        self.counts = counts = Counts()
        self.grammars = Grammars(self.fmt.tokenizer, self.fmt.stop_ids)
        self.grammars.warm()  # the first constrained call does not pay for its tokenizer
        self.planner = Planner(
            self.fmt, table, mode=mode, max_positions=self.max_positions, vocab_size=spec.vocab_size
        )
        sampler = Sampler(self.fmt)
        self.repairs = Repairs(
            table,
            runner,
            sink=len(self.fmt.sink),
            scratch=store.scratch,
            choreographed=choreo,
            default=repair,
        )
        post = Postprocess(sampler, memory, counts, jump_forward=jump_forward)
        self.stepper = Stepper(memory, runner, self.grammars, post, self.repairs, counts)
        run_alone = self.stepper.run_alone
        self.restorer = Restorer(memory, self.planner, self.repairs, run_alone, counts)
        self.finisher = Finisher(memory, sampler, choreographed=choreo)
        # what the baseline would encode of each call: the bound on its repair
        bound = choreo and repair_bound
        self.work = BaselineWork(table, self.fmt.sink, capacity) if bound else None
        self.sink = open_sink(self.fmt, memory, run_alone, self.finisher)
        if self.sink is not None:
            self.planner.sink_slots = list(table.get(self.sink.id).slots)

    def admit(
        self,
        call: Call,
        *,
        hold: bool = False,
        evict: Victims | None = None,
    ) -> Call | None:
        """Check and plan a queued call, reserve its slots and gather its view. Atomic:
        a call that fails or must wait is back as it was queued (`Call.unplan`, its
        pins still its own).

        With `hold` (baseline), returns None instead when the call's prompt shares
        HOLD_MIN_SHARED or more uncached tokens with a running call's prompt: admit
        it again after a step, and it reuses that encoding (`PrefixSharing.waits`);
        and (choreographed) when a running call is still repairing the context this
        one would repair alike: admitted after it, it reads that repaired context
        instead of recomputing the same tokens (`Repairs.tag`; without `hold`, a
        repaired call repairs a copy of its own). Evicted parents are recomputed
        first (`Restorer`); with `evict` (a victim order), encodings no running call
        reads may be dropped to make room. A call that fails leaves every message
        readable as it was. A decode with `keep` keeps the model's distribution at its
        first `keep` sampled positions (`Call.kept`).
        """
        with phase("admit"):
            try:
                admitted = self._admit(call, hold, evict)
            except BaseException:
                call.unplan()
                raise
        if not admitted:
            call.unplan()
        return call if admitted else None

    def _admit(self, call: Call, hold: bool, evict: Victims | None) -> bool:
        """Plan and place `call`; False if it must wait (see `admit`)."""
        memory, prefixes, repairs = self.memory, self.memory.prefixes, self.repairs
        request = call.request
        if self.mode == "choreographed":
            self.restorer.restore(request.parents, evict)
        request = repairs.laid_out(request)
        if isinstance(request, DecodeRequest):
            self.planner.decode(call, request)
            if request.sampling.constraint is not None:
                call.matcher = self.grammars.matcher(request.sampling.constraint)
        else:
            self.planner.prefill(call, request)
        call.adapted = repairs.adapted(call.plan)
        call.keep = call.keep if call.plan.is_decode else 0
        if prefixes is not None and not call.plan.is_decode and not call.want_logits:
            call.text_only = True  # a baseline prefill stores its text only
            call.mark_done()
            return True
        if hold and prefixes is not None and prefixes.waits(call):
            return False
        prompt = len(call.plan.prefix) if prefixes else len(call.ctx_slots) + len(call.feed)
        memory.check_fits(call, prompt, call.plan.generated_max)
        repair = repairs.of(request, call)
        tag = repairs.tag(call, repair) if hold else None  # shared only where it may wait
        if tag is not None and memory.being_written(call, tag):
            return False  # another call is repairing this very context: read it when whole
        took = not call.pins  # `reserve` pins its parents (none taken at submission)
        try:
            memory.reserve(call, call.plan.generated_max, evict)
            extra = len(call.feed) + call.plan.generated_max
            with phase("placement"):
                memory.gather(call, extra, own=not repair.none, tag=tag)
            self._repair(call, repair)
        except BaseException:
            memory.abort(call, keep_pins=not took)  # pins it came with stay its own
            raise
        call.reused = len(call.ctx_slots) - call.repaired
        self.counts.admitted(call)
        if self.work is not None and not call.want_logits:  # (an audit's shadow: not capped)
            self.work.admitted(work_of(call), call.repaired)
        return True

    def _repair(self, call: Call, repair: Repair) -> None:
        """Plan the repair of a call that built its context; one that joined a context
        another call repaired alike reads it as it is (`Repairs.tag`)."""
        if repair.none:
            return
        if not call.view.built:
            call.repair_read = str(repair)
            return
        if self.work is not None and not call.want_logits:  # never more than the baseline's
            repair = repair.capped(self.work.bound(work_of(call)))
        call.repair = self.repairs.plan(call, repair)
        if call.view.ctx is not None and call.view.ctx.key is not None:
            call.view.ctx.writer = call  # others join once its rows have run

    def step(self, order: StepPlan) -> StepOutput:
        """Run one step in one pass (`corps.engine.exec.step_plan`): the rows of the
        order's calls laid out within its budget, run in one fused forward, the
        sampling, each call advanced, and the message of every call that is done now
        (and of the order's `ready` calls) registered. A call that fails (its slots,
        its sampling, its registration, or the forward itself) is rolled back and
        reported in `failed`; the others go on."""
        calls = order.calls
        try:
            out = StepOutput()
            if calls:
                out = self.stepper.step(plan_rows(calls, order.budget, self.stepper.chunk))
        except Exception as exc:  # the forward failed: the step's calls fail, none other
            out = StepOutput(failed=[(c, exc) for c in calls], ran=False)
            for c in calls:
                self.memory.abort(c)
        failed = {c for c, _ in out.failed}
        for c in (*order.ready, *calls):
            if c.done and c not in failed:
                try:
                    if self.work is not None and c.plan.is_decode:  # its reply, as cached
                        self.work.read(c.plan.parents, cached_reply(c), c.plan.salt)
                    with phase("finish"):
                        out.finished[c] = self.finisher.finish(c)
                except Exception as exc:
                    self.memory.abort(c)
                    out.failed.append((c, exc))
        return out

    def abort(self, c: Call, keep_pins: bool = False) -> None:
        """Give back everything a call holds (but its pins, with `keep_pins`); the store
        is as if it never ran."""
        self.memory.abort(c, keep_pins)

    def pin(self, handles: Sequence[Handle | Message]) -> list[Message]:
        """Keep these messages' encodings until `unpin`, even if freed meanwhile (by
        handle, or as records already pinned)."""
        return self.memory.pin(handles)

    def unpin(self, msgs: Sequence[Message]) -> None:
        self.memory.unpin(msgs)

    def free(self, handle: Handle) -> None:
        """Free a message of this engine (its slots go once no running call reads it)."""
        with self.memory.lock:
            msg = self.planner.live(handle)  # a live message of this engine
            if msg.kind == "sink":
                raise InvalidRequest("the attention sink cannot be freed")
            self.memory.free(msg)

    def check(self) -> None:
        """BrokenInvariant unless the bookkeeping of an idle executor is exact (and its
        store's: a row for every message, a file for every encoding a row names)."""
        self.memory.check()
        if self.durable is not None:
            self.durable.check({m.id for m in self.table.all() if m.kind != "sink"})

    def gauges(self) -> tuple[int, int, int, int]:
        """(store slots used, store capacity, tokens evicted, tokens recomputed)."""
        m, n = self.memory, self.counts.tokens_recomputed
        return m.store.used_slots, m.store.capacity, m.tokens_evicted, n

    def reset_peaks(self) -> None:
        """Peaks start over from what is held now (`Engine.reset_peak_stats`)."""
        self.memory.reset_peaks()

    def prefetch(self, ids: Set[int]) -> int:
        """Expected messages copied back ahead of their readers (`Memory.prefetch`)."""
        return self.memory.prefetch(ids)

    def reset_prefix_cache(self) -> int:
        """Drop the cached prefixes no running call reads, and the work bound's record of
        what the baseline would have cached (`Engine.reset_prefix_cache`); tokens freed."""
        freed = 0
        memory = self.memory
        if memory.prefixes is not None:
            with memory.lock:
                slots = memory.prefixes.evict(memory.store.capacity)
                memory.store.release(slots)
                freed = len(slots)
        if self.work is not None:
            self.work.reset()
        return freed

    def keep_in(self, store: DurableStore) -> None:
        restore(self.memory, store, encodings=self.mode == "choreographed")
        self.durable = store

    def kv_layout(self) -> list:
        k = self.memory.store.k  # (L, S, Hkv, D)
        return [str(k.dtype).removeprefix("torch."), k.shape[0], *k.shape[2:]]

    def close(self) -> None:
        """Give back every tensor the core allocated: the KV memory, the weights and the
        RoPE tables (the engine closed; its figures stay readable)."""
        if self.durable is not None:  # its encodings saved before the memory goes
            durable, self.durable = self.durable, None
            try:
                checkpoint(self.memory, durable)
            finally:
                self.table.journal, self.memory.tier = None, None
                durable.close()
        self.memory.drop()  # its store, arena, scratch and RoPE tables
        self.grammars.close()
        self.runner.release()

    def stats(self) -> EngineStats:
        messages = len(self.table) - (1 if self.sink is not None else 0)
        return engine_stats(self.mode, self.memory, self.runner, self.grammars, self.counts,
                            messages=messages, contexts=self.context_mode,
                            repair=self.repairs.default)  # fmt: skip


def work_of(c: Call) -> Work:
    """What the repair bound reads of a choreographed call (`BaselineWork`)."""
    p = c.plan
    if not p.is_decode:
        return Work(p.parents, salt=p.salt, decode=False)
    # a final reply's tail is not encoded (unless others wait to join the repaired
    # context it builds, `Call.awaited`: then 1 + footer the bound does not see)
    extra = 0 if p.final else 1 + len(p.footer)
    return Work(p.parents, tuple(c.feed), p.salt, extra=extra)


def cached_reply(c: Call) -> list[int]:
    """A decode's header and reply as the baseline's cache would hold them."""
    return c.feed + encoded_reply(c)
