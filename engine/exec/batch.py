"""Building one step's batch: a plan of call chunks to the flat rows the runner runs.

A step plan lists, per call, which tokens it runs now (`Rows`): `(call, start, n)` is n
tokens of its feed from `start`, or with start -1 its pending sampled token and,
if it is finishing, the footer that closes its turn. `build_batch` lays them out
as one `ForwardBatch` (ids, positions, store slots, one span per call, and the
rows whose logits someone needs).

Twin calls are encoded once: decodes with the same shared context (one object:
the same slots at the same positions), nothing of their own yet, and the same
first chunk at the same positions (tree of thoughts' voters). The first runs;
the others copy its K/V after the forward and share its logit rows, and count
those tokens as reused. A twin's copy depends only on what the twin itself
reads, so it carries no other agent's context (nothing for the leak policy to see).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from corps.engine.exec.call import Call
from corps.engine.exec.step_plan import PENDING, REPAIR, Rows
from corps.engine.model.runner import ForwardBatch, SeqSpan


@dataclass
class Batch:
    forward: ForwardBatch  # the rows to run
    counts: list[int]  # logit rows of each plan entry, in plan order
    twins: list[tuple[Call, Call, int]]  # (twin, the call it copies, tokens) after the run
    twin_tokens: int  # tokens twins take from their leaders (reused, not encoded)


def build_batch(plan: Sequence[Rows], device: torch.device) -> Batch:
    """The step's rows; counts each call's encoded (and twins' reused) tokens."""
    ids, pos, slots, spans, rows, counts, t = [], [], [], [], [], [], 0
    leaders: dict[tuple, tuple[Call, list[int]]] = {}
    twins: list[tuple[Call, Call, int]] = []
    for c, start, n in plan:
        key = twin_key(c, start, n)
        if key in leaders:
            lead, lead_rows = leaders[key]
            twins.append((c, lead, n))
            c.reused += n
            rows += lead_rows
            counts.append(len(lead_rows))
            continue
        at = None
        if start == REPAIR:  # context tokens recomputed over the call's own view
            r, i = c.repair, c.repair.done
            ids += r.ids[i : i + n]
            pos += r.positions[i : i + n]
            slots += [r.slot] * n  # the store keeps the encodings others read
            at = long_tensor(r.at[i : i + n], device)
            mine = []
        elif start == PENDING:  # the pending sampled token, any it jumped to, a footer
            behind = 1 + len(c.jumped)  # generated tokens not encoded yet
            first = c.feed_start + len(c.feed) + len(c.generated) + len(c.closed) - behind
            ids += [c.pending, *c.jumped, *c.closing]  # n tokens
            pos += range(first, first + n)
            slots += c.slots[len(c.slots) - n :]
            mine = [] if c.finishing else [t + behind - 1]
        else:
            ids += c.feed[start : start + n]
            pos += range(c.feed_start + start, c.feed_start + start + n)
            slots += c.slots[start : start + n]
            mine = feed_rows(c, start, n, t)
            if key is not None:
                leaders[key] = (c, mine)
        spans.append(SeqSpan(t, t + n, c.view, c.adapted, at))
        c.encoded += n
        rows += mine
        counts.append(len(mine))
        t += n
    # one tensor, one copy to the device, viewed as the four index vectors
    flat = long_tensor([*ids, *pos, *slots, *rows], device)  # (3T + N,)
    ids_t, pos_t, slots_t, rows_t = flat.split([t, t, t, len(rows)])
    forward = ForwardBatch(ids_t, pos_t, slots_t, tuple(spans), rows_t)
    return Batch(forward, counts, twins, sum(n for _, _, n in twins))


def twin_key(c: Call, start: int, n: int) -> tuple | None:
    """What makes a decode's first chunk encode exactly as another's (see the module
    docstring); None: not a candidate."""
    v = c.view
    if start != 0 or not c.plan.is_decode or c.want_logits or v is None or v.ctx is None:
        return None
    if v.own_length or v.ctx.key is None:
        return None
    # twins share logit rows, which a constraint masks in place: only equal ones share
    return (id(v.ctx), c.feed_start, n, tuple(c.feed[:n]), c.plan.sampling.constraint)


def feed_rows(c: Call, start: int, n: int, t: int) -> list[int]:
    """Rows of a feed chunk (starting at row t) whose logits the call needs."""
    if c.want_logits:
        own_from = len(c.feed) - c.plan.own
        return list(range(t + max(start, own_from) - start, t + n))
    if c.plan.is_decode and start + n == len(c.feed):
        return [t + n - 1]
    return []


def logit_rows(plan: Sequence[Rows], counts: list[int]) -> list[tuple[Call, int]]:
    """(call, its last logit row) for each decode of the plan that has logits now."""
    out, r = [], 0
    for (c, _, _), k in zip(plan, counts, strict=True):
        r += k
        if k and c.plan.is_decode:
            out.append((c, r - 1))
    return out


def samples(c: Call, start: int, n: int) -> bool:
    """Whether plan entry (c, start, n) ends in a row the call samples its next token from."""
    if start == REPAIR:
        return False
    if start == PENDING:
        return not c.finishing
    return c.plan.is_decode and start + n == len(c.feed)


def long_tensor(values, device: torch.device) -> Tensor:
    """Index tensors are made on the store's device (index_copy_ / index_select need it)."""
    return torch.tensor(values, dtype=torch.long, device=device)
