"""`Stepper`: runs one step's plan over the store, in one straight pass.

Slots for the decoding calls' new rows, one fused forward over every row of the
plan (`corps.engine.exec.batch`), the constrained calls' masks computed on another
thread meanwhile, one draw for every sampling row (`Sampler.picks`), then each
call moved on by its rows (`Postprocess.advance`). A call that fails here (its
slots, its sampling) is rolled back and reported; the others go on.
"""

from __future__ import annotations

import time

from torch import Tensor

from corps.cache.errors import CacheFullError
from corps.engine.exec import scores
from corps.engine.exec.batch import build_batch, logit_rows, long_tensor, samples
from corps.engine.exec.call import Call
from corps.engine.exec.counts import Counts
from corps.engine.exec.draw import bias
from corps.engine.exec.grammars import Grammars
from corps.engine.exec.grammars import apply as apply_masks
from corps.engine.exec.memory import Memory
from corps.engine.exec.phases import phase, step_phase
from corps.engine.exec.postprocess import Postprocess
from corps.engine.exec.repairs import Repairs
from corps.engine.exec.step_plan import (
    REPAIR,
    Rows,
    StepOutput,
    StepPlan,
    decode_keys,
    plan_rows,
    prefill_chunk_for,
)
from corps.engine.model.runner import ModelRunner


class Stepper:
    """The forward side of a step: the runner, the masks, the draw and postprocess."""

    def __init__(
        self,
        memory: Memory,
        runner: ModelRunner,
        grammars: Grammars,
        post: Postprocess,
        repairs: Repairs,
        counts: Counts,
    ) -> None:
        self.memory, self.runner, self.grammars = memory, runner, grammars
        self.post, self.repairs, self.counts = post, repairs, counts
        self.store, self.device = memory.store, memory.store.k.device
        self.chunk = prefill_chunk_for(self.device)  # a call's prompt chunk per step

    def step(self, plan: StepPlan) -> StepOutput:
        """Run the plan's rows; the calls it moved on are advanced, failures reported."""
        out = StepOutput()
        entries = self._allocate(plan, out)
        if entries:
            self._run(entries, out)
        return out

    def run_alone(self, call: Call) -> None:
        """Step `call` alone until it is done (the attention sink, a recompute), each
        step planned as the loop plans one (`plan_rows`); raises what failed it."""
        while not call.done:
            out = self.step(plan_rows([call], chunk=self.chunk))
            if out.failed:
                raise out.failed[0][1]

    def _allocate(self, plan: StepPlan, out: StepOutput) -> list[Rows]:
        """Store slots for the decoding calls' rows (their reservations first); the
        plan's entries whose calls got them."""
        entries: list[Rows] = []
        for e in plan.entries:
            if e.is_decode:
                try:
                    self.memory.next_slots(e.call, e.n)
                except CacheFullError as exc:
                    self.memory.abort(e.call)
                    out.failed.append((e.call, exc))
                    continue
            entries.append(e)
        return entries

    def _run(self, plan: list[Rows], out: StepOutput) -> None:
        """The forward over the plan's rows, the sampling, and each call's advance."""
        for c, start, n in plan:
            if start != REPAIR:  # the spans its message was encoded in (a recompute's)
                c.spans.append(n)
        out.calls, out.rows = len(plan), sum(e.n for e in plan)
        out.chunks = sum(e.is_chunk for e in plan)
        out.keys = decode_keys([e.call.next_keys for e in plan if e.n == 1 and e.is_decode])
        out.encoded = any(not e.is_decode or e.call.finishing for e in plan)
        # constrained calls' masks are computed on another thread while the forward runs
        constrained = [c for c, start, n in plan if c.matcher is not None and samples(c, start, n)]
        masks = self.grammars.masks_async([c.matcher for c in constrained]) if constrained else None
        repairing = [e.call for e in plan if e.is_repair]
        if repairing:
            with phase("probe"):
                self.repairs.probe(repairing)  # their rows, chosen now
        decodes = sum(e.is_decode for e in plan)
        with phase(step_phase(decodes, out.chunks, len(repairing))):
            logits, rows = self._forward(plan, out)
        with phase("sample"):
            sampling_rows = logit_rows(plan, rows)
            scored = self._score(sampling_rows, logits)  # before any bias or mask
            biased = [(r, c.plan.sampling) for c, r in sampling_rows if c.plan.sampling.logit_bias]
            bias(logits, biased)
        if masks is not None:
            with phase("masks"):
                row_of = {id(c): r for c, r in sampling_rows}
                apply_masks(logits, [row_of[id(c)] for c in constrained], masks.result())
        with phase("sample"):
            self._advance(plan, rows, logits, sampling_rows, scored, out)

    def _advance(self, plan: list[Rows], rows: list[int], logits: Tensor, sampling_rows,
                 scored, out: StepOutput) -> None:  # fmt: skip
        """The draw for every sampling row, then each call moved on by its rows."""
        picks = self.post.sampler.picks(sampling_rows, logits)
        r = 0
        for (c, start, n), k in zip(plan, rows, strict=True):
            pick = picks.get(r + k - 1) if k else None
            self.post.advance(c, start, n, logits[r : r + k], out, pick)
            r += k
            if c.done:  # its view and unused reservations go now, for waiting calls
                self.memory.drop_view(c)
                self.memory.release_spare(c)
        if scored is not None:  # the tokens' logprobs, all at once
            scores.note(*scored)

    @staticmethod
    def _score(
        sampling_rows: list[tuple[Call, int]], logits: Tensor
    ) -> tuple[list[Call], Tensor] | None:
        """The model's own distribution (before any mask or bias) where it is kept:
        the rows of logprobs calls, one log-softmax for all (`exec.scores`; returned
        with their calls for `scores.note`), and an audited call's first positions
        (`Call.kept`, a copy of its own)."""
        scored = [(c, r) for c, r in sampling_rows if c.plan.sampling.logprobs]
        calls, lsm = [c for c, _ in scored], None
        if scored:
            lsm = scores.score_rows(logits, [r for _, r in scored])  # (K, V)
            for c, row in zip(calls, lsm, strict=True):
                c.scores = row
        for c, r in sampling_rows:
            if len(c.kept) < c.keep:  # an audited call's first positions
                own = c.scores
                row = own.clone() if own is not None else scores.score_rows(logits, [r])[0]
                c.kept.append((len(c.generated), row))
        return (calls, lsm) if lsm is not None else None

    def _forward(self, plan: list[Rows], out: StepOutput) -> tuple[Tensor, list[int]]:
        """Run the plan's rows; returns the logit rows (N, V) and each entry's count.
        Twin calls (`corps.engine.exec.batch`) copy their leader's K/V after the forward."""
        batch = build_batch(plan, self.device)
        self.counts.tokens_reused += batch.twin_tokens
        t0 = time.perf_counter()
        logits = self.runner.forward(batch.forward)  # (len(rows), V)
        for c, lead, n in batch.twins:
            dev = self.device
            self.store.copy(long_tensor(lead.slots[:n], dev), long_tensor(c.slots[:n], dev))
            c.view.copy_own(lead.view, n)
        out.forward_s = time.perf_counter() - t0
        self.counts.forward_seconds += out.forward_s
        self.counts.tokens_encoded += batch.forward.input_ids.numel()
        return logits, batch.counts
