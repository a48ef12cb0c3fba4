"""The `hf` mode: every call rendered as text and run by transformers, one at a time.

This is what a typical agent framework over a local transformers model does,
and the third column of `corps bench workflow`: each decode renders its
parents' tokens as one causal prompt (as baseline mode does) and runs
`model.generate` on it, with no cache shared between calls and no batching.
Planning, messages, handles and access checks are the engine's own, so
patterns and agents run unchanged. Forced decodes (`force=`) replay tokens
through a logits processor, so generate still runs one step per token, and
samples with the call's settings (only the forced token is left to draw), as the
call it replays did.
"""

from __future__ import annotations

import time
from collections.abc import Sequence, Set
from pathlib import Path

import torch
from torch import Tensor

from corps.cache.errors import require
from corps.cache.handle import Handle
from corps.cache.messages import Message, MessageTable
from corps.engine.errors import InvalidRequest
from corps.engine.exec.call import Call, top_of
from corps.engine.exec.draw import bias
from corps.engine.exec.grammars import Grammars
from corps.engine.exec.grammars import apply as apply_masks
from corps.engine.exec.planner import Planner
from corps.engine.exec.register import own_tokens, register
from corps.engine.exec.sampler import Sampler
from corps.engine.exec.step_plan import StepOutput, StepPlan
from corps.engine.model.spec import ModelSpec
from corps.engine.request.chat_format import ChatFormat
from corps.engine.request.requests import DecodeRequest
from corps.engine.stats import EngineStats


class HFExecutor:
    """Runs an engine's calls with transformers (`hf_model.generate`), one per step.

    It holds no KV store, view arena or weights of ours: each call re-encodes its
    prompt inside `generate`. It offers the step machine the loop drives (admit,
    step, abort) and the message bookkeeping the engine uses (pin, unpin, free,
    check, stats), as `KVExecutor` does.
    """

    mode = "hf"
    kernel_choice = None  # transformers picks its own kernels
    step_missing = None  # no precompiled step: transformers runs its own forward
    durable = None  # no store: it re-encodes every prompt (EngineConfig refuses one)

    def __init__(
        self, hf_model, tokenizer, spec: ModelSpec, *, model_path: Path, precision: str
    ) -> None:
        self.hf = hf_model.eval()
        self.tokenizer = tokenizer
        self.fmt = ChatFormat(tokenizer)
        self.model_path = model_path
        self.precision = precision
        self.device = next(hf_model.parameters()).device
        self.max_positions = spec.max_positions  # the model's context length
        self.table = MessageTable()
        self.planner = Planner(
            self.fmt,
            self.table,
            mode="hf",
            max_positions=spec.max_positions,
            vocab_size=spec.vocab_size,
        )
        self.sampler = Sampler(self.fmt)
        self.grammars = Grammars(self.fmt.tokenizer, self.fmt.stop_ids)
        self.grammars.warm()
        self.weight_bytes = sum(p.numel() * p.element_size() for p in self.hf.parameters())
        self.tokens_encoded = 0
        self.forward_seconds = 0.0

    # ---- the step machine ----

    def admit(
        self,
        call: Call,
        *,
        hold: bool = False,
        evict: object = None,
    ) -> Call:
        """Plan a queued call; a prefill that wants no logits stores its text and runs
        nothing (no store here: nothing to evict). Nothing is audited in mode "hf" (it is
        the baseline), so `keep` must be 0."""
        if call.keep:
            raise InvalidRequest('mode "hf" keeps no distributions: audits are choreographed')
        request = call.request
        try:
            plan = (
                self.planner.decode if isinstance(request, DecodeRequest) else self.planner.prefill
            )
            plan(call, request)
            if call.plan.is_decode and call.plan.sampling.constraint is not None:
                call.matcher = self.grammars.matcher(call.plan.sampling.constraint)
        except BaseException:
            call.unplan()
            raise
        if not call.pins:
            call.pins = self.pin(call.plan.records)
        if not call.plan.is_decode and not call.want_logits:
            call.text_only = True
            call.mark_done()
        return call

    def step(self, order: StepPlan) -> StepOutput:
        """Run the order's first unfinished call to its end (generate is not batched
        here: no rows are planned); register what is done."""
        out = StepOutput()
        c = next((c for c in order.calls if not c.done), None)
        if c is not None:
            out.encoded = True  # every call here encodes its whole prompt
            forward0 = self.forward_seconds
            try:
                self._generate(c, out) if c.plan.is_decode else self._prefill(c)
            except Exception as exc:  # this call fails alone, as in the fused loop
                self.abort(c)
                out.failed.append((c, exc))
            out.forward_s = self.forward_seconds - forward0
        failed = {f for f, _ in out.failed}
        for d in (*order.ready, *order.calls):
            if d.done and d not in failed:
                out.finished[d] = self._finish(d)
        return out

    def _finish(self, c: Call) -> Handle:
        """Register a done call's message (text and tokens; no K/V) and return its handle."""
        tokens = own_tokens(c)
        if c.plan.is_decode:
            tokens = tokens + c.generated
            c.text = self.sampler.text(tokens[c.plan.frame_len :], c.plan.sampling)
            tokens += c.closed
        handle = register(self.table, c, tokens, [], reused_encodings=False)
        self._unpin_call(c)
        return handle

    def abort(self, c: Call, keep_pins: bool = False) -> None:
        if not keep_pins:
            self._unpin_call(c)
        c.mark_done()

    # ---- messages ----

    def pin(self, handles: Sequence[Handle | Message]) -> list[Message]:
        msgs = [h if isinstance(h, Message) else self.table.live(h.id) for h in handles]
        for m in msgs:
            m.pins += 1
        return msgs

    def unpin(self, msgs: Sequence[Message]) -> None:
        for m in msgs:
            m.pins -= 1

    def _unpin_call(self, c: Call) -> None:
        pins, c.pins = c.pins, []
        self.unpin(pins)

    def free(self, handle: Handle) -> None:
        self.planner.live(handle)  # a handle of this engine
        self.table.live(handle.id).freed = True  # not freed yet; holds no slots

    def check(self) -> None:
        """BrokenInvariant unless no message is pinned or holds slots while idle."""
        for msg in self.table.all():
            require(msg.pins == 0, f"message {msg.id} still pinned while idle")
            require(not msg.slots, f"message {msg.id} holds slots in hf mode")

    def reset_peaks(self) -> None:
        """Nothing to reset: no views."""

    def reset_prefix_cache(self) -> int:
        """Nothing cached across calls here: transformers re-encodes every prompt."""
        return 0

    def prefetch(self, ids: Set[int]) -> int:
        return 0  # no store, no tier

    def gauges(self) -> tuple[int, int, int, int]:
        return 0, 0, 0, 0  # no store; transformers' own cache: nothing evicted

    def keep_in(self, store) -> None:
        raise InvalidRequest("mode 'hf' keeps no encodings: a store is for our KV store")

    def kv_layout(self) -> list:
        return []

    def close(self) -> None:
        """Give the model back (the engine closed)."""
        self.hf = None

    def stats(self) -> EngineStats:
        return EngineStats(
            mode="hf",
            capacity=0,
            tokens_used=0,
            tokens_free=0,
            messages=len(self.table),
            tokens_encoded=self.tokens_encoded,
            tokens_reused=0,
            prefix_hit_tokens=0,
            prefix_query_tokens=0,
            weight_bytes=self.weight_bytes,
            forward_s=self.forward_seconds,
            constraints_compiled=len(self.grammars.compile_seconds),
            constraint_compile_s=sum(self.grammars.compile_seconds.values()),
        )

    @torch.inference_mode()
    def _prefill(self, c: Call) -> None:
        """A prefill that wants logits (no other prefill computes anything here)."""
        t0 = time.perf_counter()
        logits = self.hf(torch.tensor([c.plan.prefix], device=self.device)).logits[0]  # (T, V)
        self.forward_seconds += time.perf_counter() - t0
        c.logits.append(logits[len(c.plan.prefix) - c.plan.own :])
        self.tokens_encoded += len(c.plan.prefix)
        c.encoded = len(c.plan.prefix)
        c.mark_done()

    @torch.inference_mode()
    def _generate(self, c: Call, out: StepOutput) -> None:
        from transformers import GenerationConfig, LogitsProcessorList

        sp = c.plan.sampling
        prompt = torch.tensor([c.plan.prefix], device=self.device)  # (1, P)
        n = len(sp.force) or sp.max_tokens
        sampled = not sp.greedy  # a forced call samples too (its processor leaves one token)
        config = GenerationConfig(
            max_new_tokens=n,
            min_new_tokens=n if (sp.force or sp.ignore_eos) else 0,
            do_sample=sampled,
            eos_token_id=None if (sp.force or sp.ignore_eos) else sorted(self.fmt.stop_ids),
            pad_token_id=0,
            **(dict(temperature=sp.temperature, top_p=sp.top_p, top_k=sp.top_k) if sampled else {}),
        )
        scores = _Scores()  # first: it sees the model's own logits
        processors = LogitsProcessorList([scores] if sp.logprobs else [])
        if sp.force:
            processors.append(_Forced(sp.force, prompt.shape[1]))
        if sp.logit_bias:
            processors.append(_Bias(sp))
        if c.matcher is not None:
            processors.append(_Constrained(c.matcher, prompt.shape[1], self.grammars))
        if sp.seed is not None:
            torch.manual_seed(sp.seed % 2**64)
        clock = _FirstToken()
        t0 = time.perf_counter()
        ids = self.hf.generate(
            prompt, generation_config=config, logits_processor=processors, streamer=clock
        )
        self.forward_seconds += time.perf_counter() - t0
        c.generated = ids[0, prompt.shape[1] :].tolist()
        for row, tok in zip(scores.rows, c.generated, strict=False):
            c.logprobs.append(float(row[tok]))
            c.greedy.append(int(row.argmax()))
            c.top += top_of(row, sp.top_logprobs)
        if c.matcher is not None and c.generated:
            self.sampler.take(c, c.generated[-1])  # the processor took all but the last
        c.finish_reason = (
            self.sampler.stops(c, c.generated[-1]) if c.generated else None
        ) or "max_tokens"
        c.first_token = clock.at
        c.closed = (
            self.sampler.closing(c.plan.footer, c.generated[-1])
            if c.generated
            else list(c.plan.footer)
        )
        c.encoded = len(c.plan.prefix) + len(c.generated) - 1
        self.tokens_encoded += c.encoded
        out.tokens += [(c, tok) for tok in c.generated]
        c.mark_done()


class _Scores:
    """Logits processor that keeps each step's log-softmax (for `logprobs=True`)."""

    def __init__(self) -> None:
        self.rows: list[Tensor] = []

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        self.rows.append(torch.log_softmax(scores[0].float(), dim=-1))  # (V,)
        return scores


class _Forced:
    """Logits processor: at step i only forced token i may be chosen."""

    def __init__(self, force: Sequence[int], prompt_len: int) -> None:
        self.force, self.start = list(force), prompt_len

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        i = input_ids.shape[1] - self.start
        out = torch.full_like(scores, float("-inf"))  # (1, V)
        out[:, self.force[i]] = 0.0
        return out


class _Bias:
    """Logits processor: the call's `logit_bias`, as the corps engines add it."""

    def __init__(self, params) -> None:
        self.params = params

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        bias(scores, [(0, self.params)])  # (1, V) in place
        return scores


class _Constrained:
    """Logits processor: a constrained call's matcher takes the token chosen at the
    previous step, then masks the scores to what its constraint allows next."""

    def __init__(self, matcher, prompt_len: int, grammars: Grammars) -> None:
        self.matcher, self.start, self.grammars = matcher, prompt_len, grammars

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        if input_ids.shape[1] > self.start:
            self.matcher.consume_token(int(input_ids[0, -1]))
        apply_masks(scores, [0], self.grammars.masks([self.matcher]))  # (1, V) in place
        return scores


class _FirstToken:
    """A generate streamer that only notes when the first new token came out."""

    def __init__(self) -> None:
        self.at: float | None = None
        self._puts = 0

    def put(self, value: Tensor) -> None:
        self._puts += 1  # the first put is the prompt
        if self._puts == 2:
            self.at = time.perf_counter()

    def end(self) -> None:
        pass
