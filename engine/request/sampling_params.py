"""`SamplingParams`: how one decode picks its tokens and when it stops, checked once.

The draws themselves (greedy, temperature, top-k, top-p, seeded) are
`corps.engine.exec.draw`."""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass

import torch

from corps.engine.errors import InvalidRequest
from corps.engine.request.constraint import Constraint

#: the most alternatives `top_logprobs` lists per position (OpenAI's bound)
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class SamplingParams:
    """How one decode call picks tokens and when it stops.

    temperature 0 is greedy. `seed` makes a sampled call reproducible on its own,
    whatever else runs beside it. `stop` strings end the message once its text
    contains one (the text is cut before it); EOS / end-of-turn stops unless
    `ignore_eos`. `force` teacher-forces a decode (benchmarks replaying another
    run's tokens): it runs one step per forced token exactly as if sampling, and
    emits exactly those tokens, whatever the logits say. `logprobs` notes, for each
    emitted token, its log-probability under the model's own distribution at that
    position (temperature 1, no top-p/top-k, before any constraint's mask) and the
    token greedy decoding would have emitted there (`Handle.logprobs`, `Handle.greedy`).
    `logit_bias` adds to a token's score before the draw, as (token id, bias) pairs
    with biases in [-100, 100]: -100 bans the token (its score becomes -inf), 100
    makes it the only one (OpenAI's semantics); a given dict is turned into pairs.
    """

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False  # keep going past EOS / end-of-turn (benchmarks)
    force: tuple[int, ...] = ()  # emit exactly these tokens (benchmarks: equal work)
    constraint: Constraint | None = None  # what the generated text must match
    logprobs: bool = False  # note each emitted token's log-probability (Handle.logprobs)
    top_logprobs: int = 0  # with logprobs: the k most likely tokens too (Handle.top_logprobs)
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias in [-100, 100])

    def __post_init__(self) -> None:
        if isinstance(self.logit_bias, dict):
            object.__setattr__(self, "logit_bias", tuple(sorted(self.logit_bias.items())))
        for pair in self.logit_bias:
            t, b = pair if isinstance(pair, tuple) and len(pair) == 2 else (None, None)
            if isinstance(t, bool) or not isinstance(t, int) or t < 0:
                raise InvalidRequest(f"logit_bias keys must be token ids, got {t!r}")
            if not _number(b) or not -100 <= b <= 100:
                raise InvalidRequest(f"logit_bias values must be in [-100, 100], got {b!r}")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
            raise InvalidRequest(f"max_tokens must be an int, got {self.max_tokens!r}")
        if self.max_tokens <= 0:
            raise InvalidRequest(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not _number(self.temperature) or self.temperature < 0:
            raise InvalidRequest(f"temperature must be a number >= 0, got {self.temperature!r}")
        if not _number(self.top_p) or not 0 < self.top_p <= 1:
            raise InvalidRequest(f"top_p must be in (0, 1], got {self.top_p!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise InvalidRequest(f"top_k must be an int >= 0 (0 = off), got {self.top_k!r}")
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, int)
        ):
            raise InvalidRequest(f"seed must be an int or None, got {self.seed!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequest(f"stop must be non-empty strings, got {self.stop!r}")
        if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in self.force):
            raise InvalidRequest(f"force must be token ids, got {self.force!r}")
        if self.constraint is not None and not isinstance(self.constraint, Constraint):
            raise InvalidRequest(
                f"constraint must come from constraint_of(...), got {self.constraint!r}"
            )
        k = self.top_logprobs
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_TOP_LOGPROBS:
            raise InvalidRequest(f"top_logprobs must be an int in 0..{MAX_TOP_LOGPROBS}, got {k!r}")
        if k and not self.logprobs:
            raise InvalidRequest("top_logprobs needs logprobs=True")
        if len(self.force) > self.max_tokens:
            raise InvalidRequest(
                f"force has {len(self.force)} tokens but max_tokens is {self.max_tokens}; "
                f"give max_tokens >= len(force)"
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def generator(self) -> torch.Generator | None:
        if self.greedy:
            return None
        gen = torch.Generator()
        # An unseeded call draws its seed from the OS, not torch.seed(): that reseeds the
        # process's global generator (a side effect on the user's RNG) and, through
        # torch.cuda's lazy init, cost ~0.8 ms per call here.
        # Any int is a seed: reduced to the generator's 64-bit range (manual_seed raises
        # past it), so a huge seed from a client is a seed, not a crash.
        seed = self.seed % 2**64 if self.seed is not None else secrets.randbits(63)
        gen.manual_seed(seed)
        return gen


def _number(x: object) -> bool:
    """A finite real number (not a bool, not NaN or infinite)."""
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
