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
from collections.abc import Sequence

import torch
from torch import Tensor

from corps.engine.core import Core, StepOutput
from corps.engine.planner import Call


class HFCore(Core):
    """A Core whose calls are run by transformers (`hf_model.generate`), one per step."""

    def __init__(self, hf_model, *args, **kwargs) -> None:
        kwargs["mode"] = "hf"
        super().__init__(*args, **kwargs)
        self.hf = hf_model.eval()

    def step(self, calls: Sequence[Call], budget: int | None) -> StepOutput:
        """Run the first unfinished call to its end (generate is not batched here)."""
        out = StepOutput()
        c = next((c for c in calls if not c.done), None)
        if c is None:
            return out
        out.encoded = True  # every call here encodes its whole prompt
        try:
            self._generate(c, out) if c.is_decode else self._prefill(c)
        except Exception as exc:  # this call fails alone, as in the fused loop
            self.abort(c)
            out.failed.append((c, exc))
        return out

    @torch.inference_mode()
    def _prefill(self, c: Call) -> None:
        """A prefill that wants logits (no other prefill computes anything here)."""
        t0 = time.perf_counter()
        logits = self.hf(torch.tensor([c.prefix], device=self.device)).logits[0]  # (T, V)
        self.forward_seconds += time.perf_counter() - t0
        c.logits.append(logits[len(c.prefix) - c.own :])
        self.tokens_encoded += len(c.prefix)
        c.encoded, c.done = len(c.prefix), True

    @torch.inference_mode()
    def _generate(self, c: Call, out: StepOutput) -> None:
        from transformers import GenerationConfig, LogitsProcessorList

        sp = c.sampling
        prompt = torch.tensor([c.prefix], device=self.device)  # (1, P)
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
        processors = LogitsProcessorList([_Forced(sp.force, prompt.shape[1])] if sp.force else [])
        if sp.seed is not None:
            torch.manual_seed(sp.seed)
        clock = _FirstToken()
        t0 = time.perf_counter()
        ids = self.hf.generate(
            prompt, generation_config=config, logits_processor=processors, streamer=clock
        )
        self.forward_seconds += time.perf_counter() - t0
        c.generated = ids[0, prompt.shape[1] :].tolist()
        c.first_token_at = clock.at
        c.closed = (
            self.sampler.closing(c.footer, c.generated[-1]) if c.generated else list(c.footer)
        )
        c.encoded = len(c.prefix) + len(c.generated) - 1
        self.tokens_encoded += c.encoded
        out.tokens += [(c, tok) for tok in c.generated]
        c.done = True


class _Forced:
    """Logits processor: at step i only forced token i may be chosen."""

    def __init__(self, force: Sequence[int], prompt_len: int) -> None:
        self.force, self.start = list(force), prompt_len

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        i = input_ids.shape[1] - self.start
        out = torch.full_like(scores, float("-inf"))  # (1, V)
        out[:, self.force[i]] = 0.0
        return out


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
