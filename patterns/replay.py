"""Equal work across implementations: record a run's decoded tokens, force them later.

The Prompt Choreography paper compares implementations on equal work: every
implementation decodes the same tokens. A `Replay` records the tokens each
decode turn of a run generated (keyed by the turn's index in its run, which
does not depend on timing), and forces exactly those tokens on the same turns
of a later run of the same pattern and inputs. Given the same tokens, a
pattern takes the same path (same parses, same votes, same early stops), so
the replayed run makes the same calls.

    replay = Replay()                      # records
    with replay.active():
        await run_pattern(rt_baseline, "debate", params)
    with replay.forcing().active():        # forces the recorded tokens
        await run_pattern(rt_choreo, "debate", params)

With `logprobs=True` every decode turn asks the engine for its tokens'
log-probabilities, and the replay keeps them per turn (`scores`), with the role
that decoded it: how fidelity compares two modes on the same tokens
(`corps.patterns.evaluation.fidelity`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any


class ReplayMismatch(RuntimeError):
    """A forced run asked for a turn the recorded run did not make."""


@dataclass(frozen=True)
class TurnScores:
    """What one decode turn emitted and how the model scored it there."""

    role: str  # the agent's role in its pattern ("voter", "answerer", ...)
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]  # of each token (Handle.logprobs)
    greedy: tuple[int, ...]  # the argmax at each position (Handle.greedy)
    message: int = -1  # the id of the message the turn made (in its engine)
    ttft_s: float | None = None  # submit to first token (Handle.ttft)
    reused: int = 0  # context tokens read as encoded (Handle.tokens_reused)
    repaired: int = 0  # rewired context tokens recomputed (Handle.tokens_repaired)
    encoded: int = 0  # tokens the turn ran through the model (Handle.tokens_encoded)

    @property
    def context_encoded(self) -> int:
        """Context (prompt) tokens the turn encoded: its encoded less its generated; for
        a baseline turn, the baseline's own work (its prefix-cache hits not counted)."""
        return max(0, self.encoded - len(self.tokens))


class Replay:
    """Decoded tokens per turn index: recorded by one run, forced on another."""

    def __init__(
        self,
        tokens: dict[int, tuple[int, ...]] | None = None,
        *,
        logprobs: bool = False,
        figures: bool = False,
    ) -> None:
        self.recording = tokens is None
        self.tokens: dict[int, tuple[int, ...]] = dict(tokens or {})
        self.logprobs = logprobs
        # each turn's TurnScores: with logprobs, or (figures) its costs alone, without
        # asking the engine for log-probabilities (which changes how it decodes)
        self.figures = figures or logprobs
        self.scores: dict[int, TurnScores] = {}

    def forcing(self, *, logprobs: bool = False, figures: bool = False) -> Replay:
        """A replay that forces what this one recorded."""
        return Replay(self.tokens, logprobs=logprobs, figures=figures)

    def record(self, index: int, handle: Any) -> None:
        """Turn `index` made `handle` (a decode's Handle)."""
        if self.recording:
            self.tokens[index] = tuple(handle.generated)
        if self.figures:
            # a pattern's agents are named "<pattern>-<run id>-<role>" (patterns.run)
            role = (handle.owner or "").split("-", 2)[-1] or "(engine)"
            self.scores[index] = TurnScores(
                role,
                tuple(handle.generated),
                tuple(handle.logprobs),
                tuple(handle.greedy),
                handle.id,
                handle.ttft,
                handle.tokens_reused,
                handle.tokens_repaired,
                handle.tokens_encoded,
            )

    def force(self, index: int) -> tuple[int, ...] | None:
        """The tokens turn `index` must decode (None while recording)."""
        if self.recording:
            return None
        if index not in self.tokens:
            raise ReplayMismatch(
                f"turn {index} was not in the recorded run: replay the same pattern with the "
                f"same inputs and parameters"
            )
        return self.tokens[index]

    @contextmanager
    def active(self) -> Iterator[Replay]:
        """Runs started inside this block (in this task and tasks it starts) use it."""
        token = CURRENT.set(self)
        try:
            yield self
        finally:
            CURRENT.reset(token)


CURRENT: ContextVar[Replay | None] = ContextVar("corps_replay", default=None)
