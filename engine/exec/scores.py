"""A step's log-probabilities, for every call that wants them at once.

A decode with `sampling.logprobs` keeps, per token it emits, the token's
log-probability under the model's own distribution (before any mask or bias),
the greedy token there, and its `top_logprobs` most likely tokens. Taken call by
call that was a log-softmax, an argmax over the vocabulary and a top-k each, and
three transfers to the host (on a GPU, three syncs a call and step; on a CPU,
torch's scalar argmax over 49k scores: 16 calls took 1.6 ms a step, 0.5 ms
together). Here: one log-softmax over the step's scored rows (`score_rows`),
each call's row a view of it (`Call.scores`), and once each call has accepted its
token (`Call.scored`), one gather, one argmax and one top-k over those rows for
all of them, each brought to the host once (`note`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from corps.engine.exec.call import Call
from corps.engine.exec.draw import first_argmax


def score_rows(logits: Tensor, rows: list[int]) -> Tensor:
    """The log-softmax (K, V), in float32, of logits' rows (N, V)."""
    return torch.log_softmax(logits[rows].float(), dim=-1)


def note(calls: Sequence[Call], rows: Tensor) -> None:
    """The step's scored calls, in the order of their rows (K, V) from `score_rows`:
    for each that accepted a token this step, the token's log-probability, the greedy
    token and its `top_logprobs` most likely, appended to `logprobs`, `greedy` and
    `top`; its row is let go. A call that accepted nothing is left as it was."""
    took = [i for i, c in enumerate(calls) if c.scored is not None]
    if not took:
        return
    todo = [calls[i] for i in took]
    if len(took) < len(calls):
        rows = rows[took]  # (K', V)
    tokens = torch.tensor([c.scored for c in todo], device=rows.device)  # (K',)
    picked = rows.gather(1, tokens[:, None])[:, 0].tolist()
    greedy = first_argmax(rows).tolist()
    k = max(c.plan.sampling.top_logprobs for c in todo)
    ids: list[list[int]] = []
    vals: list[list[float]] = []
    if k:  # the k most likely of each row, in order (K, k)
        top = rows.topk(k)
        ids, vals = top.indices.tolist(), top.values.tolist()
    for i, c in enumerate(todo):
        c.logprobs.append(picked[i])
        c.greedy.append(greedy[i])
        own = c.plan.sampling.top_logprobs
        if own:  # the first `own` of the k most likely, in order
            c.top.append(tuple(zip(ids[i][:own], vals[i][:own], strict=True)))
        c.scores = c.scored = None
