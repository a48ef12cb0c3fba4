"""A call's repair: which of its rewired context tokens it recomputes, as step rows.

`corps.engine.repair` names the policy. At admission a repaired call gets a
context that no call reading the stored encodings shares (what it recomputes
must not change what they read), and `Repairs.plan` picks the tokens: the
rewired parents (from the first parent the chain breaks at,
`corps.cache.rewired.first_rewired`) are where choreography changed what the
call reads; among their tokens the policy takes the first K of each, a share by
deviation, or all. The chosen tokens become the
call's repair rows (`RepairRows`): prefill rows of the ordinary fused steps, run
before its own prompt, each at its position in the call's context, writing its
recomputed keys and values over the reused ones in the call's view (the store
keeps its own: the rows write there to a scratch slot) and attending to the view
up to itself, so a chosen token sees the tokens before it as the call reads them,
earlier chosen ones recomputed. Their logits are not needed.

A share by deviation ("recompute:R") needs a probe: two layers over every rewired
token in the call's context. It runs inside the call's first step, batched with
the probes of every other call whose repair starts in that step (`Repairs.probe`),
so sixteen calls admitted together probe in one pass, not sixteen. The count of
rows is known at admission (the first K of each rewired parent, plus R of the
rewired tokens among the others), so the step plan can budget them before the
probe has picked which.

Calls that would repair the same context alike share one repair (`Repairs.tag`:
the same slots at the same positions, the same policy, and for "query:R" the
same query): the first builds the repaired context and runs the rows; the
others are held at admission until its rows have run (`Memory.being_written`),
then read that context and recompute nothing (`Call.repair_read`). A tree of
thoughts' voters over one set of proposals repair them once, as the baseline's
prefix cache encodes them once for all voters. If the builder is given back
before its rows ran, its context goes with it and the next call builds its own.
"""

from __future__ import annotations

import dataclasses

import torch

from corps.cache.messages import MessageTable
from corps.cache.rewired import first_rewired, rewired
from corps.engine.exec.call import Call, CallPlan
from corps.engine.exec.repair_rows import Probe, Query, RepairRows
from corps.engine.model.runner import ModelRunner
from corps.engine.repair import NONE, PROBE_LAYER, QUERY_DEPTH, QUERY_ROWS, Repair
from corps.engine.request.requests import DecodeRequest, PrefillRequest


class Repairs:
    """The repair part of an executor: which repair a call gets, how its request is
    laid out for it, and the rows that carry it out (chosen at admission, or by the
    batched probe in the call's first step)."""

    def __init__(
        self,
        table: MessageTable,
        runner: ModelRunner,
        *,
        sink: int,
        scratch: int,
        choreographed: bool,
        default: Repair = NONE,
    ) -> None:
        self.table, self.runner = table, runner
        self.sink = sink  # tokens of the attention sink at the front of every context
        self.scratch = scratch  # the store's scratch slot (`KVStore.scratch`)
        self.choreographed = choreographed
        self.default = default  # the repair of calls that name none (EngineConfig.repair)

    def requested(self, request: PrefillRequest | DecodeRequest) -> Repair:
        """The repair a request names (its agent's or workflow's filled in at
        submission), else the engine's."""
        return request.repair if request.repair is not None else self.default

    def laid_out(self, request: PrefillRequest | DecodeRequest) -> PrefillRequest | DecodeRequest:
        """The request as it runs: under a `serial` repair (`Repair.serial`, choreographed
        mode), its parents end to end from where it puts the first, its message right
        after them; else as it is."""
        if not self.requested(request).serial or not self.choreographed:
            return request
        first = request.offsets[0] if request.offsets else None
        offsets = [first] + [None] * (len(request.parents) - 1) if request.parents else None
        return dataclasses.replace(request, offsets=offsets, new_offset=None)

    def of(self, request: PrefillRequest | DecodeRequest, c: Call) -> Repair:
        """The repair a call gets: its request's, else the engine's; none in baseline
        mode (nothing is rewired) and for a call whose context is a chain."""
        repair = self.requested(request)
        if repair.none or not self.choreographed or c.plan.kind == "sink":
            return NONE
        return repair if self.ranges(c) else NONE

    def adapted(self, plan: CallPlan) -> bool:
        """Whether an adapter kept apart (scope "rewired", `model.adapter_rows`) applies
        to a call of this plan: a choreographed call whose context is rewired."""
        w = self.runner.w
        if w is None or w.lora is None or not self.choreographed or plan.kind == "sink":
            return False
        return rewired(plan.offset, plan.parents, plan.parent_offsets, self.table.get, self.sink)

    def tag(self, c: Call, repair: Repair) -> tuple | None:
        """What tells c's repaired context apart from others over the same slots at the
        same positions (`Memory.gather`'s tag): calls with equal tags would recompute
        the same rows to the same keys and values, so the first builds the context and
        the others read it (a tree of thoughts' voters over one set of proposals
        repair it once, not once each). The policy, and for a share chosen by the
        query's attention the query's own tokens and where they sit. None: no repair."""
        if repair.none:
            return None
        if not repair.query:
            return ("repair", repair)
        return ("repair", repair, tuple(c.feed[-QUERY_ROWS:]), c.feed_start)

    def ranges(self, c: Call) -> list[tuple[int, int]]:
        """(first view index, length) of each rewired parent of `c`, in order; [] when
        its context is a chain."""
        plan, table = c.plan, self.table
        first = first_rewired(plan.parents, plan.parent_offsets, table.get, self.sink)
        at = len(c.ctx_slots) - sum(len(table.get(p).tokens) for p in plan.parents)  # the sink
        out = []
        for i, pid in enumerate(plan.parents):
            n = len(table.get(pid).tokens)
            if i >= first and n:
                out.append((at, n))
            at += n
        return out

    def plan(self, c: Call, repair: Repair) -> RepairRows | None:
        """The rows that repair `c` (its view open, its context its own), or None when
        the policy picks nothing (a chain, "none", a share rounding to no token). A
        temperature is applied to the rewired keys not chosen (`warm`): here, or after
        the probe where one picks the rows."""
        ranges = self.ranges(c)
        every = [j for s, n in ranges for j in range(s, s + n)]
        if dataclasses.replace(repair, cap=None).none or not every:
            return None  # (a cap of 0 still says what it cut)
        tokens, positions = self.context_tokens(c), dict(enumerate(c.ctx_pos))
        if repair.full or repair.share >= 1.0:
            fixed = every
        else:
            fixed = [s + j for s, n in ranges for j in range(min(repair.first, n))]
        k = min(round(repair.share * len(every)), len(every) - len(fixed))
        wanted = len(fixed) + k
        if repair.cap is not None:  # the fixed ones in view order, then the probe's best
            fixed = fixed[: repair.cap]
            k = min(k, repair.cap - len(fixed))
        rows = RepairRows(len(fixed) + k, self.scratch, len(every), repair)
        rows.cut = wanted - rows.total
        if k:  # chosen in the call's first step, with the other calls' probes
            query = self.query_rows(c, tokens, positions) if repair.query else None
            rows.probe = Probe(every, [tokens[j] for j in every], [positions[j] for j in every],
                               fixed, k, query)  # fmt: skip
            rows.probed = len(query.ids) if query is not None else len(every)
            return rows
        settle(c, rows, fixed, every, tokens, positions)
        return rows if rows.total or rows.cut else None

    def query_rows(self, c: Call, tokens: dict[int, int], positions: dict[int, int]) -> Query:
        """The last QUERY_ROWS tokens `c` reads: the end of its context (its last
        parent's, where a question or instruction sits), then its own new tokens."""
        n = len(c.ctx_slots)
        own = list(range(len(c.feed)))[-QUERY_ROWS:]
        room = QUERY_ROWS - len(own)
        ctx = [j for j in range(n) if j in tokens][-room:] if room else []  # not the sink
        ids = [tokens[j] for j in ctx] + [c.feed[i] for i in own]
        pos = [positions[j] for j in ctx] + [c.feed_start + i for i in own]
        return Query(ids, pos, ctx + [n + i for i in own])

    def probe(self, calls: list[Call]) -> None:
        """Choose the rows of every call in `calls` whose repair waits on its probe: one
        batched pass for all of them, over their rewired tokens through PROBE_LAYER + 1
        layers (`ModelRunner.deviation`, "recompute:R") or over their query rows through
        the first QUERY_DEPTH of the layers (`ModelRunner.query_attention`, "query:R"),
        then each call's top k by that
        score among its tokens not already chosen."""
        waiting = [c for c in calls if c.repair is not None and c.repair.probe is not None]
        if not waiting:
            return
        by_dev = [c for c in waiting if c.repair.probe.query is None]
        by_query = [c for c in waiting if c.repair.probe.query is not None]
        scored = []
        if by_dev:
            items = [(c.view, c.repair.probe.ids, c.repair.probe.positions, c.repair.probe.every)
                     for c in by_dev]  # fmt: skip
            scored += zip(by_dev, self.runner.deviation(items, PROBE_LAYER), strict=True)
        if by_query:
            items = [(c.view, p.query.ids, p.query.positions, p.query.at, p.every)
                     for c in by_query for p in [c.repair.probe]]  # fmt: skip
            depth = round(self.runner.spec.num_layers * QUERY_DEPTH)  # the last layer it runs
            scored += zip(by_query, self.runner.query_attention(items, depth), strict=True)
        for c, dev in scored:
            rows, p = c.repair, c.repair.probe
            fixed = set(p.fixed)
            free = torch.tensor([j not in fixed for j in p.every], device=dev.device)
            top = torch.topk(dev.masked_fill(~free, float("-inf")), p.k).indices.tolist()
            rows.probe = None
            settle(c, rows, [*p.fixed, *(p.every[i] for i in top)], p.every,
                   dict(zip(p.every, p.ids, strict=True)),
                   dict(zip(p.every, p.positions, strict=True)))  # fmt: skip

    def context_tokens(self, c: Call) -> dict[int, int]:
        """Token id at each view index of `c`'s parents (the sink's are never rewired)."""
        at = len(c.ctx_slots) - sum(len(self.table.get(p).tokens) for p in c.plan.parents)
        out = {}
        for pid in c.plan.parents:
            for tok in self.table.get(pid).tokens:
                out[at] = tok
                at += 1
        return out


def settle(
    c: Call,
    rows: RepairRows,
    chosen: list[int],
    every: list[int],
    tokens: dict[int, int],
    positions: dict[int, int],
) -> None:
    """`rows` recompute the view indices `chosen`; the other rewired ones (`every`)
    are read at the policy's temperature (`warm`)."""
    rows.take(chosen, tokens, positions)
    if rows.policy.temperature != 1.0:
        picked = set(chosen)
        warm(c, [j for j in every if j not in picked], rows.policy.temperature)


def warm(c: Call, at: list[int], temperature: float) -> None:
    """Scale the keys at view indices `at` by 1 / temperature in every layer of the
    call's own context: its queries then attend over them at that temperature."""
    if at:
        idx = torch.tensor(at, device=c.view.k.device)
        keys = c.view.k  # (L, Hkv, n, D), the call's own copy
        keys.index_copy_(2, idx, keys.index_select(2, idx) / temperature)
