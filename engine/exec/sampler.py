"""The sampler: a step's logit rows to tokens, and when a decode stops.

One `Sampler` per engine. Each step it picks the next token of every decode
that has a logit row (`picks`: one argmax over the greedy rows, one batched
draw over the sampled ones), then per call (`next_token`) replays a forced
token or falls back to drawing alone, decides whether the call stops (`stops`:
forced length, max_tokens, end of turn, stop strings) and which footer tokens
close its turn (`closing`). A constrained call's logit row is masked before
`picks` (`corps.engine.exec.grammars`), and its matcher takes each token it emits.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from corps.engine.errors import ConstraintViolated
from corps.engine.exec.call import Call
from corps.engine.exec.draw import argmax_rows, forced, sample, sample_rows, take_rows
from corps.engine.request.chat_format import ChatFormat
from corps.engine.request.sampling_params import SamplingParams


class Sampler:
    """Turns logits into tokens for the calls of one engine (its chat format's stops)."""

    def __init__(self, fmt: ChatFormat) -> None:
        self.fmt = fmt

    def picks(self, rows: Sequence[tuple[Call, int]], logits: Tensor) -> dict[int, int]:
        """Logit row -> drawn token for decodes that pick one now; `rows` gives each
        such call's row in `logits` (N, V).

        One argmax over the greedy ones' rows (a per-call argmax over the vocabulary
        cost ~60 us) and one batched draw for the sampled ones (each from its own
        generator, so it draws what it would alone). Forced calls are in: they do the
        work of the calls they replay. A row missing (its logits not finite, or the
        batched draw failed) samples alone in `next_token`, where an error fails
        that call only."""
        greedy = [r for c, r in rows if c.plan.sampling.greedy]
        sampled = [(r, c) for c, r in rows if not c.plan.sampling.greedy]
        picks = (
            dict(zip(greedy, argmax_rows(take_rows(logits, greedy)), strict=True)) if greedy else {}
        )
        if sampled:
            at = [i for i, _ in sampled]
            params, gens = [c.plan.sampling for _, c in sampled], [c.generator for _, c in sampled]
            try:
                drawn = sample_rows(take_rows(logits, at), params, gens)
            except Exception:  # each samples alone in next_token: an error fails it only
                drawn = [None] * len(at)
            picks |= {i: t for i, t in zip(at, drawn, strict=True) if t is not None}
        return picks

    def next_token(self, c: Call, logits: Tensor, pick: int | None) -> int:
        """The call's next token: the batched pick (or its forced token), else a draw
        from its last logit row alone. Raises on a sampling error (that call fails)."""
        if pick is not None:
            return forced(c.plan.sampling, len(c.generated), pick)
        return sample(logits[-1], c.plan.sampling, c.generator, len(c.generated))

    def stops(self, c: Call, tok: int) -> str | None:
        """Why `tok` (just appended to `c.generated`) is the call's last token, or None:
        "forced" (its forced tokens are out), "end_of_turn" (an end-of-turn token),
        "constraint" (its constraint allows nothing more), "stop_string" or
        "max_tokens"."""
        s = c.plan.sampling
        if s.force:
            return "forced" if len(c.generated) >= len(s.force) else None
        if tok in self.fmt.stop_ids and not s.ignore_eos:
            return "end_of_turn"
        if c.matcher is not None and c.matcher.is_stopped():
            return "constraint"
        if s.stop:
            tail = self.fmt.decode(c.generated[-32:])
            if any(x in tail for x in s.stop):
                return "stop_string"
        if len(c.generated) >= s.max_tokens:
            return "max_tokens"
        return None

    def take(self, c: Call, tok: int) -> None:
        """A constrained call's matcher takes the token it emits; ConstraintViolated if
        the token breaks the constraint (a forced token that does not match it)."""
        if c.matcher is not None and not c.matcher.consume_token(tok):
            raise ConstraintViolated(
                f"token {tok} ({self.fmt.decode([tok])!r}) does not match the call's "
                f"{c.plan.sampling.constraint.describe()}: {c.matcher.get_error()}"
            )

    def closing(self, footer: list[int], last: int) -> list[int]:
        """The footer tokens that close a turn whose last generated token is `last`.

        A turn that ended on the footer's own end-of-turn token gets the rest of the
        footer (SmolLM2: the newline after <|im_end|>); one cut by max_tokens or a stop
        string gets the whole footer, so later turns read the framing the model knows.
        """
        if last in self.fmt.stop_ids and last in footer:
            return footer[footer.index(last) + 1 :]
        return list(footer)

    def text(self, tokens: list[int], sampling: SamplingParams) -> str:
        """A decoded message's text: end-of-turn tokens dropped, cut before a stop string."""
        text = self.fmt.decode([t for t in tokens if t not in self.fmt.stop_ids])
        cuts = [text.find(s) for s in sampling.stop if s in text]
        return text[: min(cuts)] if cuts else text
