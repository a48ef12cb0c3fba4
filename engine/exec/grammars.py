"""An engine's constraints, compiled once, and the token masks of a step's constrained calls.

llguidance does the matching (chosen by measurement on SmolLM2's 49k vocabulary:
it compiles a JSON schema in under a millisecond where xgrammar and
outlines-core took 0.7-1.1 s, and masks 16 calls in about a millisecond, see
`corps bench constrained`). Per engine: one llguidance tokenizer, one compiled
template per constraint (a call gets a copy), and one worker thread that computes
a step's masks while the forward runs. The tokenizer is built on that thread as
soon as the engine opens (`warm`: the model tokenizer's JSON is taken on the
caller's thread, ~0.1 s for SmolLM2, the rest, ~0.2 s and llguidance's imports, in
the background), so the first constrained call does not pay for it in its time
to first token; it waits only if it comes before the build is done. A mask is a
bitmask (B, ceil(V/32)) int32; `apply` turns the disallowed logits of each row to
-inf in place.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from copy import copy
from typing import Any

import torch
from torch import Tensor

from corps.engine.errors import InvalidConstraint
from corps.engine.request.constraint import Constraint


class Grammars:
    """Compiles constraints against one tokenizer and computes their masks."""

    def __init__(self, tokenizer: Any, stop_ids: Sequence[int]) -> None:
        self._hf = tokenizer
        self._stops = sorted(stop_ids)
        self._tok: Any = None
        self._building: Future | None = None  # the tokenizer, built in the background
        self._templates: dict[Constraint, Any] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._executor: Any = None
        self.compile_seconds: dict[Constraint, float] = {}
        """Seconds each constraint took to compile (once per engine)."""
        self.tokenizer_seconds = 0.0

    def warm(self) -> None:
        """Start building the llguidance tokenizer on the worker thread (the engine calls
        this when it opens). The model tokenizer's JSON is taken here, on the caller's
        thread: the Hugging Face tokenizer is not used from two threads at once."""
        backend = getattr(self._hf, "backend_tokenizer", None)
        if self._tok is not None or self._building is not None or backend is None:
            return
        import llguidance.torch  # noqa: F401  here, on the torch thread: it touches torch

        backend = copy(backend)
        backend.no_padding()
        backend.no_truncation()
        self._building = self._worker().submit(_build, backend.to_str(), self._stops)

    @property
    def tokenizer(self) -> Any:
        """llguidance's view of the model's tokenizer (built once: in the background
        since `warm`, else now)."""
        if self._tok is None:
            if self._building is not None:
                self._tok, self.tokenizer_seconds = self._building.result()
            else:
                import llguidance.hf

                t0 = time.perf_counter()
                self._tok = llguidance.hf.from_tokenizer(self._hf, eos_token=self._stops)
                self.tokenizer_seconds = time.perf_counter() - t0
        return self._tok

    def _worker(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="corps-masks")
        return self._pool

    def compile(self, constraint: Constraint) -> None:
        """Compile `constraint` (once per engine); InvalidConstraint if it cannot be."""
        if constraint in self._templates:
            return
        from llguidance import LLMatcher

        tokenizer = self.tokenizer  # built once, not counted in the compile time
        t0 = time.perf_counter()
        try:
            grammar = constraint.grammar()
        except ValueError as exc:
            raise InvalidConstraint(f"{constraint.describe()}: {exc}") from None
        error = LLMatcher.validate_grammar(grammar, tokenizer)
        if error and not error.startswith("WARNING"):
            raise InvalidConstraint(f"{constraint.describe()} does not compile: {error}")
        template = LLMatcher(tokenizer, grammar, log_level=0)
        if template.is_error():
            raise InvalidConstraint(
                f"{constraint.describe()} does not compile: {template.get_error()}"
            )
        self._templates[constraint] = template
        self.compile_seconds[constraint] = time.perf_counter() - t0

    def matcher(self, constraint: Constraint) -> Any:
        """A fresh matcher for one call (its own state), from the compiled template."""
        self.compile(constraint)
        return self._templates[constraint].deep_copy()

    def masks(self, matchers: Sequence[Any]) -> Tensor:
        """The allowed next tokens of each matcher: a bitmask (B, ceil(V/32)) int32."""
        return self._fill(list(matchers), self._bitmask(len(matchers)))

    def masks_async(self, matchers: Sequence[Any]) -> Future[Tensor]:
        """`masks(matchers)` on the worker thread, so it overlaps the step's forward.

        The bitmask is allocated here, on the caller's (torch) thread: torch fills a
        large one in parallel, and a parallel region entered from the worker thread
        would give it an OpenMP team of its own, which slows every later step
        (`corps.engine.exec.torch_thread` says how much and why)."""
        return self._worker().submit(self._fill, list(matchers), self._bitmask(len(matchers)))

    def _bitmask(self, rows: int) -> Tensor:
        from llguidance.torch import allocate_token_bitmask

        return allocate_token_bitmask(rows, self.tokenizer.vocab_size)  # (B, ceil(V/32))

    def _fill(self, matchers: list[Any], mask: Tensor) -> Tensor:
        """Each matcher's allowed tokens into its row of `mask`; no torch op runs here
        (llguidance writes the rows itself), so any thread may call it."""
        import llguidance
        from llguidance.torch import fill_next_token_bitmask_par

        if self._executor is None:
            self._executor = llguidance.LLExecutor()
        fill_next_token_bitmask_par(self._executor, [(m, i) for i, m in enumerate(matchers)], mask)
        return mask

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def _build(tokenizer_json: str, stops: list[int]) -> tuple[Any, float]:
    """An llguidance tokenizer from a tokenizer's JSON (no torch, no Python tokenizer:
    safe on the worker thread: nothing here may run a torch op, which would give
    the worker an OpenMP team of its own, `corps.engine.exec.torch_thread`); and the
    seconds it took."""
    t0 = time.perf_counter()
    import llguidance

    tok = llguidance.LLTokenizer(tokenizer_json, eos_token=stops)
    return tok, time.perf_counter() - t0


#: For every byte value v, what its 8 bits add to 8 logits: 0 where the bit is set
#: (allowed), -inf where not; a (256, 8) table that unpacks a bitmask byte by byte (a
#: little-endian int32 word's bytes hold its bits 0-7, 8-15, ...). One gather and one
#: add per step: a boolean masked_fill over 16 rows of a 49k vocabulary took ~2 ms.
_BITS = (torch.arange(256)[:, None] >> torch.arange(8)).bitwise_and(1).bool()
_BIAS = torch.where(_BITS, 0.0, float("-inf"))


@torch.inference_mode()  # the logits are the forward's inference tensors
def apply(logits: Tensor, rows: Sequence[int], mask: Tensor) -> None:
    """Set to -inf, in place, the logits (N, V) of each of `rows` that its row of
    `mask` (len(rows), W) disallows; tokens past the mask's 32 W are disallowed."""
    if not rows:
        return
    b, v = len(rows), logits.shape[-1]
    flat = mask.contiguous().view(torch.uint8).flatten().long()  # (4 B W,) bytes
    bias = _BIAS.index_select(0, flat).view(b, -1)  # (B, 32 W): 0 allowed, -inf not
    if bias.shape[1] < v:
        bias = torch.nn.functional.pad(bias, (0, v - bias.shape[1]), value=float("-inf"))
    idx = torch.tensor(list(rows), dtype=torch.long, device=logits.device)
    logits.index_add_(0, idx, bias[:, :v].to(device=logits.device, dtype=logits.dtype))
