"""A call's repair: which of its rewired context tokens it recomputes, as step rows.

`corps.engine.repair` names the policy. At admission a repaired call gets
a context of its own (not shared with other readers: what it recomputes is its
alone), and `plan_repair` picks the tokens: the rewired parents (from the first
parent the chain breaks at, `corps.cache.rewired.first_rewired`) are where
choreography changed what the call reads; among their tokens the policy takes
the first K of each, a share by deviation, or all. The chosen tokens become the
call's repair rows (`RepairRows`): prefill rows of the ordinary fused steps, run
before its own prompt, each at its position in the call's context, writing its
recomputed keys and values over the reused ones in the call's view (the store
keeps its own: the rows write there to a scratch slot) and attending to the view
up to itself, so a chosen token sees the tokens before it as the call reads them,
earlier chosen ones recomputed. Their logits are not needed.

A share by deviation ("recompute:R") needs a probe: two layers over every rewired
token in the call's context. It runs inside the call's first step, batched with
the probes of every other call whose repair starts in that step (`probe`), so
sixteen calls admitted together probe in one pass, not sixteen. The count of
rows is known at admission (the first K of each rewired parent, plus R of the
rewired tokens among the others), so the step plan can budget them before the
probe has picked which.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from corps.cache.rewired import first_rewired
from corps.engine.repair import PROBE_LAYER, Repair

if TYPE_CHECKING:
    from corps.engine.exec.call import Call
    from corps.engine.exec.core import Core


@dataclass
class Probe:
    """What a share by deviation chooses among, at the call's first step (`probe`)."""

    every: list[int]  # view indices of every rewired token (the probe runs them all)
    ids: list[int]  # their token ids
    positions: list[int]  # their positions in the call's context
    fixed: list[int]  # view indices chosen without it (the first K of each parent)
    k: int  # how many more it picks among the others: those that move most


@dataclass
class RepairRows:
    """The tokens a call recomputes, in view order, and how many have run."""

    total: int  # rows it runs (known at admission)
    slot: int  # the store's scratch slot: recomputed K/V are the call's, not stored
    rewired: int  # tokens of the rewired parents (what a "full" repair recomputes)
    policy: Repair  # the policy that chose them
    ids: list[int] = field(default_factory=list)  # token ids (empty while probe is pending)
    positions: list[int] = field(default_factory=list)  # positions in the call's context
    at: list[int] = field(default_factory=list)  # indices in the call's view
    probe: Probe | None = None  # pending: the rows are chosen by the first step's probe
    probed: int = 0  # tokens the deviation probe runs through its layers
    done: int = 0  # rows run so far

    @property
    def left(self) -> int:
        return self.total - self.done

    def take(self, at: list[int], tokens: dict[int, int], positions: dict[int, int]) -> None:
        """Recompute the tokens at view indices `at`, in view order."""
        self.at = sorted(at)
        self.ids = [tokens[j] for j in self.at]
        self.positions = [positions[j] for j in self.at]


def rewired_ranges(core: Core, c: Call) -> list[tuple[int, int]]:
    """(first view index, length) of each rewired parent of `c`, in order; [] when
    its context is a chain."""
    plan, table = c.plan, core.table
    first = first_rewired(plan.parents, plan.parent_offsets, table.get, len(core.fmt.sink))
    at = len(c.ctx_slots) - sum(len(table.get(p).tokens) for p in plan.parents)  # the sink
    out = []
    for i, pid in enumerate(plan.parents):
        n = len(table.get(pid).tokens)
        if i >= first and n:
            out.append((at, n))
        at += n
    return out


def plan_repair(core: Core, c: Call, repair: Repair) -> RepairRows | None:
    """The rows that repair `c` (its view open, its context its own), or None when
    the policy picks nothing (a chain, "none", a share rounding to no token). A
    temperature is applied to the rewired keys not chosen (`warm`): here, or after
    the probe where one picks the rows."""
    ranges = rewired_ranges(core, c)
    every = [j for s, n in ranges for j in range(s, s + n)]
    if repair.none or not every:
        return None
    tokens, positions = context_tokens(core, c), dict(enumerate(c.ctx_pos))
    if repair.full or repair.ratio >= 1.0:
        fixed = every
    else:
        fixed = [s + j for s, n in ranges for j in range(min(repair.first, n))]
    k = min(round(repair.ratio * len(every)), len(every) - len(fixed))
    rows = RepairRows(len(fixed) + k, core.store.scratch, len(every), repair)
    if k:  # chosen in the call's first step, with the other calls' probes
        rows.probe = Probe(every, [tokens[j] for j in every], [positions[j] for j in every],
                           fixed, k)  # fmt: skip
        rows.probed = len(every)
        return rows
    settle(c, rows, fixed, every, tokens, positions)
    return rows if rows.total else None


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


def probe(core: Core, calls: list[Call]) -> None:
    """Choose the rows of every call in `calls` whose repair waits on its probe: one
    batched two-layer pass over all their rewired tokens (`ModelRunner.deviation`),
    then each call's top k by deviation among its tokens not already chosen."""
    waiting = [c for c in calls if c.repair is not None and c.repair.probe is not None]
    if not waiting:
        return
    items = [(c.view, c.repair.probe.ids, c.repair.probe.positions, c.repair.probe.every)
             for c in waiting]  # fmt: skip
    for c, dev in zip(waiting, core.runner.deviation(items, PROBE_LAYER), strict=True):
        rows, p = c.repair, c.repair.probe
        fixed = set(p.fixed)
        free = torch.tensor([j not in fixed for j in p.every], device=dev.device)
        top = torch.topk(dev.masked_fill(~free, float("-inf")), p.k).indices.tolist()
        rows.probe = None
        settle(c, rows, [*p.fixed, *(p.every[i] for i in top)], p.every,
               dict(zip(p.every, p.ids, strict=True)),
               dict(zip(p.every, p.positions, strict=True)))  # fmt: skip


def warm(c: Call, at: list[int], temperature: float) -> None:
    """Scale the keys at view indices `at` by 1 / temperature in every layer of the
    call's own context: its queries then attend over them at that temperature."""
    if at:
        idx = torch.tensor(at, device=c.view.k.device)
        keys = c.view.k  # (L, Hkv, n, D), the call's own copy
        keys.index_copy_(2, idx, keys.index_select(2, idx) / temperature)


def context_tokens(core: Core, c: Call) -> dict[int, int]:
    """Token id at each view index of `c`'s parents (the sink's are never rewired)."""
    at = len(c.ctx_slots) - sum(len(core.table.get(p).tokens) for p in c.plan.parents)
    out = {}
    for pid in c.plan.parents:
        for tok in core.table.get(pid).tokens:
            out[at] = tok
            at += 1
    return out
