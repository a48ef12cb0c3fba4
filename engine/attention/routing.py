"""How a step's rows attend: which go through one batched plan, which span by span.

The runner hands over the step's spans (one per call: the rows that extend its
view); `split_step` decides once per step, and every layer attends through the
same `StepSplit`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from corps.cache.view import CallView
from corps.engine.attention.backend import AttentionBackend
from corps.engine.attention.plan import DecodePlan, gathered_lengths

#: Short spans are batched only while their padded scores stay this small per query
#: head (x 4 bytes x heads: ~38 MB for this model family's 9 heads), since padding
#: every span to the longest one grows with the product; one by one they stay small.
SHORT_SPAN_PAIRS = 1 << 20


@dataclass(frozen=True)
class SeqSpan:
    """Rows [start, end) of a flat batch that extend one call's view."""

    start: int
    end: int
    view: CallView
    adapted: bool = False  # the rows take an adapter kept apart (`corps.engine.model.adapter_rows`)
    # repair rows (`corps.engine.exec.repairs`): the view indices (t,) inside the call's
    # context the rows recompute (each writes there, sees the view up to itself);
    # None: the rows extend the view
    at: Tensor | None = None


def split_step(
    attention: AttentionBackend,
    spans: tuple[SeqSpan, ...],
    device: torch.device,
    group_min_saved: int | None,
) -> StepSplit:
    """How this step's rows attend. Decodes (one-row spans) go through one batched
    plan over the arena when they can; so do short prefill spans (role headers)
    when some of them read a shared context, as sixteen voters' headers over one
    set of branches do: per span, those are the slow two-part attention (measured
    here per layer: 8 spans over a shared 72-token context 0.9 ms batched against
    1.9 ms, 16 over 1100 tokens 8.2 against 11.8), while spans over contexts of
    their own are as fast through SDPA one by one. The rest (long prefill chunks)
    go through the backend's span attention; a mixed step keeps every path."""
    att = attention
    batched = _batched(att, spans, group_min_saved)
    taken = {id(sp) for group, _ in batched for sp in group}
    rest = tuple(sp for sp in spans if id(sp) not in taken)
    if not batched:
        return StepSplit((StepPart(None, None, spans, att.plan_prefill(spans)),))
    if not rest and len(batched) == 1:  # every row through one plan, in batch order
        return StepSplit((StepPart(None, batched[0][1]),))
    dev = device
    parts = [StepPart(_rows(group, dev), plan) for group, plan in batched]
    if rest:
        renum = _renumbered(rest)
        parts.append(StepPart(_rows(rest, dev), None, renum, att.plan_prefill(renum)))
    return StepSplit(tuple(parts))


def _batched(
    att: AttentionBackend, spans, group_min_saved: int | None
) -> list[tuple[list[SeqSpan], DecodePlan]]:
    """The spans attended through a batched plan, with their plan: the decodes,
    then the short spans when some read a shared context and their padded scores
    stay under SHORT_SPAN_PAIRS."""
    ones = [sp for sp in spans if sp.end - sp.start == 1 and sp.at is None]
    short = [sp for sp in spans if 1 < sp.end - sp.start <= att.short_span_rows and sp.at is None]
    if all(sp.view.contiguous for sp in short) or _padded_pairs(short) > SHORT_SPAN_PAIRS:
        short = []
    out = []
    keys = getattr(att, "plan_keys", None)
    decodes = [ones] if keys is None or len(ones) < 2 else _by_length(ones, group_min_saved, keys)
    for group, min_calls in [*((g, att.decode_min_calls) for g in decodes), (short, 2)]:
        if group:
            rows = [sp.end - sp.start for sp in group]
            views = [sp.view for sp in group]
            plan = DecodePlan.of(views, min_calls, group_min_saved, rows)
            if plan is not None:
                out.append((group, plan))
    return out


def _by_length(ones: list[SeqSpan], min_saved: int | None, keys: int) -> list[list[SeqSpan]]:
    """The decodes in groups of similar gathered length (`split_by_length`), each group
    attended through a plan of its own: a plan pads every call to its longest."""
    lengths = gathered_lengths([sp.view for sp in ones], min_saved)
    return [[ones[i] for i in group] for group in split_by_length(lengths, keys)]


def split_by_length(lengths: list[int], overhead: int) -> list[list[int]]:
    """Indices of `lengths` in groups minimising the padded work, sum over groups of
    `overhead` + size x longest: a batched plan pads each call to its longest, and
    costs about `overhead` keys of work of its own. Groups are runs of the lengths in
    sorted order (an optimal split always is one); one group when splitting cannot
    save `overhead`. Each group lists its indices in increasing order (a single group
    is the batch in order). Dynamic programming, O(n^2) for n decodes."""
    n = len(lengths)
    if n < 2 or n * max(lengths) - sum(lengths) <= overhead:
        return [list(range(n))]
    order = sorted(range(n), key=lambda i: lengths[i])
    best, cut = [0] + [0] * n, [0] * (n + 1)  # best[j]: the first j sorted, split best
    for j in range(1, n + 1):
        longest = lengths[order[j - 1]]
        best[j], cut[j] = min((best[i] + overhead + (j - i) * longest, i) for i in range(j))
    groups, j = [], n
    while j:
        groups.append(sorted(order[cut[j] : j]))  # each in batch order
        j = cut[j]
    return groups[::-1]


def _padded_pairs(spans: list[SeqSpan]) -> int:
    """(row, key) pairs a batched plan over these spans scores per query head: every
    span padded to the most rows and the longest view."""
    if not spans:
        return 0
    rows = max(sp.end - sp.start for sp in spans)
    return len(spans) * rows * max(sp.view.length + rows for sp in spans)


def _rows(spans, device) -> Tensor:
    """(T,) the step's rows of these spans, span after span."""
    return torch.tensor([r for sp in spans for r in range(sp.start, sp.end)], device=device)


def _renumbered(spans) -> tuple[SeqSpan, ...]:
    """The spans numbered over their own rows, in order (for attending them apart)."""
    out, t = [], 0
    for sp in spans:
        out.append(SeqSpan(t, t + sp.end - sp.start, sp.view, sp.adapted, sp.at))
        t += sp.end - sp.start
    return tuple(out)


@dataclass(frozen=True)
class StepPart:
    """Some of a step's rows and how they attend: one batched plan (decodes, short
    spans), or span by span with the backend's prefill plan."""

    rows: Tensor | None  # (Tp,) its rows of the step, span after span; None: all, in order
    plan: DecodePlan | None  # None: the spans attend one by one
    spans: tuple[SeqSpan, ...] = ()  # without a plan: its spans, over its own rows
    prefill: Any = None  # the backend's prefill plan for those spans

    def attend(self, attention: AttentionBackend, layer: int, q, k, v, scale: float) -> Tensor:
        """Output (Tp, Hq, D) of the part's rows q (Tp, Hq, D), k, v (Tp, Hkv, D)."""
        if self.plan is not None:
            return attention.attend_decode(layer, q, k, v, self.plan, scale)
        return attention.attend_spans(layer, q, k, v, self.spans, self.prefill, scale)


@dataclass(frozen=True)
class StepSplit:
    """One step's rows split in parts, each attended its own way."""

    parts: tuple[StepPart, ...]

    def attend(self, attention: AttentionBackend, layer: int, q, k, v, scale: float) -> Tensor:
        """Attention output (T, Hq, D) of every row; q (T, Hq, D), k, v (T, Hkv, D)."""
        if len(self.parts) == 1 and self.parts[0].rows is None:
            return self.parts[0].attend(attention, layer, q, k, v, scale)
        out = torch.empty_like(q)
        for part in self.parts:
            r = part.rows
            out.index_copy_(0, r, part.attend(attention, layer, q[r], k[r], v[r], scale))
        return out
