"""`Engine.select`: score a fixed set of options after a context and keep the best.

Each option is encoded as its own message (the role's framing, the header, the
option, the footer: the turn the model would have written), all of them
children of the same parents at the same offset, in one fused step. An option's
score is the log-probability of its tokens, each read from the row before it;
the chosen option's encoding is kept as a message (a `Handle`), the others are
freed. SGLang's `select`, over corps' store.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from corps.cache.handle import Handle
from corps.engine.api.submit import Submitter
from corps.engine.errors import InvalidRequest
from corps.engine.exec.call import Call
from corps.engine.request.chat_format import ChatFormat
from corps.engine.request.requests import PrefillRequest

By = Literal["normalized", "total"]


@dataclass(frozen=True)
class Selection:
    """What `select` chose and why.

    `index` and `option`: the choice; `totals`: each option's summed token
    log-probability; `normalized`: the same divided by its token count (the
    default criterion, which does not favour short options); `handle`: the chosen
    option as a message, for later calls to attend to."""

    index: int
    option: str
    totals: tuple[float, ...]
    normalized: tuple[float, ...]
    handle: Handle


@dataclass(frozen=True)
class Option:
    """One option as a message: `content` ids (header then option, tokenized apart so
    every option starts on a token boundary), framed by the role when the chat
    template has one; its tokens are own[start:start + n]."""

    content: list[int]
    framed: bool
    start: int
    n: int


def option_of(fmt: ChatFormat, role: str, header: str, option: str) -> Option:
    if not isinstance(option, str) or not option:
        raise InvalidRequest(f"each option must be a non-empty string, got {option!r}")
    head = fmt.encode(fmt.frame(role)[0]) if fmt.has_template else []
    before = fmt.encode(header) if header else []
    if not head and not before:
        raise InvalidRequest(
            "select needs a header (or a role the chat template frames): an option's first "
            "token is scored from the token before it"
        )
    ids = fmt.encode(option)
    return Option(before + ids, fmt.has_template, len(head) + len(before), len(ids))


def score(logits: Tensor, own: Sequence[int], start: int, end: int) -> float:
    """Summed log-probability of own[start:end], each from the row before it;
    `logits` (len(own), V) are the rows of the message's own tokens."""
    rows = logits[start - 1 : end - 1].float()  # (n, V): row i predicts token i + 1
    logp = torch.log_softmax(rows, dim=-1)
    picked = logp.gather(-1, torch.tensor(own[start:end], device=logits.device)[:, None])
    return float(picked.sum())


def scored(call: Call, option: Option) -> float:
    """An option's score from the call that encoded it (with its own tokens' logits)."""
    own = call.plan.prefix[len(call.plan.prefix) - call.plan.own :]
    return score(torch.cat(call.logits), own, option.start, option.start + option.n)


def check_by(by: str) -> None:
    if by not in ("normalized", "total"):
        raise InvalidRequest(f"by must be 'normalized' or 'total', got {by!r}")


def choose(totals: Sequence[float], lengths: Sequence[int], by: By) -> tuple[int, list[float]]:
    """The chosen index (the first of equals) and the length-normalised scores."""
    normalized = [t / n for t, n in zip(totals, lengths, strict=True)]
    keys = normalized if by == "normalized" else list(totals)
    best = max(range(len(keys)), key=lambda i: (keys[i], -i))
    if not math.isfinite(keys[best]):
        raise InvalidRequest("every option scored -inf: the model gives them no probability")
    return best, normalized


async def select(
    submit: Submitter,
    fmt: ChatFormat,
    free: Callable[[Handle], None],
    options: Sequence[str],
    header: str,
    by: By,
    common: dict[str, Any],
) -> Selection:
    """`Engine.select`: every option encoded as a turn after the same parents (the
    `common` request fields) in one fused step, scored, the best kept and the
    others freed (`free`)."""
    if isinstance(options, str) or not options or len(set(options)) != len(options):
        raise InvalidRequest(f"options must be distinct strings, at least one: {options!r}")
    check_by(by)
    built = [option_of(fmt, common["role"], header, o) for o in options]
    requests = [PrefillRequest(o.content, frame=o.framed, **common) for o in built]
    done = await submit.run_calls(requests, want_logits=True)
    totals = [scored(call, o) for o, (_, call) in zip(built, done, strict=True)]
    try:
        best, normalized = choose(totals, [o.n for o in built], by)
    except InvalidRequest:  # no option has any probability: keep none of them
        for h, _ in done:
            free(h)
        raise
    for i, (h, _) in enumerate(done):
        if i != best:
            free(h)
    return Selection(best, options[best], tuple(totals), tuple(normalized), done[best][0])
