"""Postprocess: a call after its rows of a step ran, moved on by what they gave.

`Postprocess.advance` takes one plan entry's logit rows: a prompt chunk is counted as
encoded (cached for the baseline, kept for `want_logits`); once a decode's feed
is encoded, or its pending token is, it samples the next token (`Sampler`),
applies jump-forward (`jump`), and when it stops takes the footer that closes
its turn. The call's own transitions (`Call.accept`, `Call.jump`, ...) write its
state; a sampling error fails that call only (rolled back, in `out.failed`).
"""

from __future__ import annotations

import itertools

from torch import Tensor

from corps.engine.exec.call import Call
from corps.engine.exec.counts import Counts
from corps.engine.exec.memory import Memory
from corps.engine.exec.prefixes import PrefixSharing
from corps.engine.exec.sampler import Sampler
from corps.engine.exec.step_plan import PENDING, REPAIR, StepOutput


class Postprocess:
    """Moves calls on after their rows ran: sampling, jump-forward, stopping."""

    def __init__(
        self,
        sampler: Sampler,
        memory: Memory,
        counts: Counts,
        *,
        jump_forward: bool,
    ) -> None:
        self.sampler, self.memory, self.counts = sampler, memory, counts
        self.prefixes: PrefixSharing | None = memory.prefixes  # the baseline's radix tree
        self.jump_forward = jump_forward

    def advance(
        self, c: Call, start: int, n: int, logits: Tensor, out: StepOutput, pick: int | None
    ) -> None:
        """Move `c` on after its entry (start, n) ran; `logits` are its rows, `pick` the
        token drawn for it with the step's other calls (None: it draws alone)."""
        if start == REPAIR:  # context tokens recomputed: its prompt runs after them
            c.repair.done += n
            return
        if start == PENDING:
            c.encoded_pending()
            if c.done:  # its last token and footer are encoded: the turn is closed
                return
        else:
            whole = c.fed_rows(n)
            if c.uid:
                self.prefixes.cache_fed(c)
            if c.want_logits:
                c.logits.append(logits)
            if not whole:
                return
            if not c.plan.is_decode:
                c.mark_done()
                return
        self._sample(c, logits, out, pick)

    def _sample(self, c: Call, logits: Tensor, out: StepOutput, pick: int | None) -> None:
        sampler = self.sampler
        try:
            tok = sampler.next_token(c, logits, pick)
            sampler.take(c, tok)
        except Exception as exc:  # a sampling error fails this call only
            self.memory.abort(c)
            out.failed.append((c, exc))
            return
        c.accept(tok)
        out.tokens.append((c, tok))
        reason = sampler.stops(c, tok)
        if reason is None and c.matcher is not None and self.jump_forward:
            reason = self.jump(c, out)
        if reason is None:
            return
        c.finish_with(reason, sampler.closing(c.plan.footer, c.generated[-1]))
        if self.prefixes is not None or (c.plan.final and not c.awaited):
            # The baseline re-encodes a turn's text wherever it is read, so it never runs
            # the last token and footer through the model (a serving engine's prefix cache
            # keeps a finished request's prompt and output but its last token): the call
            # is done. Choreography must encode them, as the message, unless no call will
            # read it (`final`: its encoding is set aside, `Finisher`). A final call
            # whose repaired context others wait to join still closes its turn: that
            # step keeps the context for them.
            c.close_unencoded()

    def jump(self, c: Call, out: StepOutput) -> str | None:
        """Jump-forward: the tokens c's constraint forces next (llguidance's fast-forward
        tokens, which stop short of a token boundary that the next bytes could still
        change) are appended now without sampling, and encoded with its pending token
        as one span next step. Returns why the call stops after them, if it does."""
        if c.plan.sampling.logprobs:  # every token needs its own logit row
            return None
        forced = c.matcher.compute_ff_tokens()[: c.budget_left]
        force = c.plan.sampling.force
        if force:  # a teacher-forced call jumps only as far as its own tokens agree
            ahead = force[len(c.generated) :]
            agree = itertools.takewhile(lambda p: p[0] == p[1], zip(forced, ahead, strict=False))
            forced = [t for t, _ in agree]
        if not forced or not c.matcher.consume_tokens(forced):
            return None
        c.jump(forced)
        self.counts.tokens_jumped += len(forced)
        out.tokens += [(c, t) for t in forced]
        return self.sampler.stops(c, forced[-1])
