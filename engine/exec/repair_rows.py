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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from corps.cache.rewired import first_rewired
from corps.engine.repair import PROBE_LAYER, Repair

if TYPE_CHECKING:
    from corps.engine.exec.call import Call
    from corps.engine.exec.core import Core


@dataclass
class RepairRows:
    """The tokens a call recomputes, in view order, and how many have run."""

    ids: list[int]  # token ids
    positions: list[int]  # their positions in the call's context
    at: list[int]  # their indices in the call's view
    slot: int  # the store's scratch slot: recomputed K/V are the call's, not stored
    rewired: int  # tokens of the rewired parents (what a "full" repair recomputes)
    policy: Repair  # the policy that chose them
    probed: int = 0  # tokens the deviation probe ran through its layers
    done: int = 0  # rows run so far

    @property
    def left(self) -> int:
        return len(self.ids) - self.done


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
    temperature is applied here, to the rewired keys not chosen (`warm`)."""
    ranges = rewired_ranges(core, c)
    every = [j for s, n in ranges for j in range(s, s + n)]
    if repair.none or not every:
        return None
    rows = choose(core, c, repair, ranges, every)
    if repair.temperature != 1.0:
        chosen = set(rows.at) if rows is not None else set()
        warm(c, [j for j in every if j not in chosen], repair.temperature)
    return rows


def warm(c: Call, at: list[int], temperature: float) -> None:
    """Scale the keys at view indices `at` by 1 / temperature in every layer of the
    call's own context: its queries then attend over them at that temperature."""
    if at:
        idx = torch.tensor(at, device=c.view.k.device)
        keys = c.view.k  # (L, Hkv, n, D), the call's own copy
        keys.index_copy_(2, idx, keys.index_select(2, idx) / temperature)


def choose(
    core: Core, c: Call, repair: Repair, ranges: list[tuple[int, int]], every: list[int]
) -> RepairRows | None:
    """The recomputed tokens among the rewired ones `every` (in `ranges`), or None."""
    tokens = context_tokens(core, c)
    chosen: set[int] = set()
    probed = 0
    if repair.full or repair.ratio >= 1.0:
        chosen = set(every)
    else:
        chosen |= {s + j for s, n in ranges for j in range(min(repair.first, n))}
        k = round(repair.ratio * len(every))
        if k:
            dev = core.runner.deviation(
                c.view, [tokens[j] for j in every], [c.ctx_pos[j] for j in every], every,
                PROBE_LAYER,
            )  # fmt: skip
            probed = len(every)
            top = torch.topk(dev, k).indices.tolist()
            chosen |= {every[i] for i in top}
    if not chosen:
        return None
    at = sorted(chosen)
    return RepairRows(
        [tokens[j] for j in at], [c.ctx_pos[j] for j in at], at, core.store.scratch,
        len(every), repair, probed,
    )  # fmt: skip


def context_tokens(core: Core, c: Call) -> dict[int, int]:
    """Token id at each view index of `c`'s parents (the sink's are never rewired)."""
    at = len(c.ctx_slots) - sum(len(core.table.get(p).tokens) for p in c.plan.parents)
    out = {}
    for pid in c.plan.parents:
        for tok in core.table.get(pid).tokens:
            out[at] = tok
            at += 1
    return out
