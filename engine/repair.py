"""`Repair`: which reused encodings a call recomputes in its own context.

A choreographed call reads its parents' encodings as they were made. When its
context is rewired (`corps.cache.rewired`: parents encoded apart, moved, or over
context it does not read), those encodings differ from what encoding its
context afresh would give, and answers can suffer (the paper's blockage). A
repair recomputes some of the rewired tokens' keys and values in the call's
actual context (its parents at its offsets, in order, causally) before the call
attends; the recomputed encodings are the call's own (nothing another call
reads changes). Policies, written as strings (`--repair`, `repair=`):

- "none": read every encoding as it is (the default);
- "first:K": the first K tokens of each rewired parent (EPIC's false sinks: an
  independently encoded message carries attention-sink keys at its start);
- "recompute:R": a share R (0..1) of the rewired tokens, those whose layer-1
  keys and values move most in the call's context (CacheBlend's criterion,
  measured by a two-layer probe over every rewired token, run in the call's
  first step batched with the other calls' probes); with "first:K", R more
  besides the first K;
- "query:R": a share R (0..1) of the rewired tokens, those the call's query pays
  most attention to (InfoFlow KV's criterion): the last QUERY_ROWS tokens the call
  reads (its own new tokens and the end of its last parent, where the question
  or instruction sits) are run through the first half of the layers
  (QUERY_DEPTH) over the call's context as it reads it, and each rewired token
  is scored by the attention those rows pay it, summed over heads, rows and
  layers; batched with
  the other calls' probes like "recompute:R"'s, at their global positions. With
  "first:K", R more besides the first K; not with "recompute:R" (one criterion);
- "full": every rewired token (the upper bound: the call reads what encoding its
  whole context in order would give);
- "temp:T": recompute nothing, but read the rewired tokens' keys at attention
  temperature T (APE's, for contexts encoded in parallel: T < 1 sharpens the
  call's attention over them), by scaling those keys by 1/T in the call's own
  copy of its context;
- "serial": before anything is recomputed, lay the call's parents end to end
  (the first where the call puts it, each next right after) and its message right
  after them, as the baseline's text sits, whatever offsets the call gave: a pure
  re-positioning (CacheBlend's first step; keys rotate, nothing is encoded).
  Parents the call overlaps (a parallel layout, e.g. multi-QA's) otherwise sit at
  positions no recompute can correct; the call gives up the positions the overlap
  saved. Combine it: "serial+full" reads what the baseline reads (when the first
  parent starts the conversation);
- "auto": not a policy but a choice of one, made per workflow and agent by the
  audit's figures (`corps.engine.auto_repair`): the cheapest rung of a ladder
  first, a stronger one while the audited gap is high, back when it stays low;
- "cap:N": at most N tokens recomputed, whatever the rest chose (the first K of
  each parent in view order, then the probe's best); the engine caps every repair
  of a choreographed call at what the baseline would encode of its context
  (`corps.engine.exec.baseline_work`), so a repair never costs more than the
  baseline's own encoding of the same call;
- "A+B": several together (e.g. "first:4+recompute:0.1", "first:4+temp:0.8"; a
  temperature applies to the rewired tokens not recomputed).

Torch-free: the engine's planner turns a Repair into rows (`corps.engine.exec.repairs`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from corps.engine.errors import InvalidRequest

#: The probe's layer: keys and values of layer 1 are the first that depend on context.
PROBE_LAYER = 1
#: Rows a query probe ("query:R") scores attention from: the end of what the call reads.
QUERY_ROWS = 32
#: How deep a query probe runs, as a share of the model's layers (its last layer: this
#: share of the count, rounded). Measured on SmolLM2-135M (docs/fidelity.md): its first
#: two layers chose worse than deviation (31% / 30% of the gap closed at R = 0.3 on
#: parallel debate / tree of thoughts), half of them as well or better (59% / 50%).
QUERY_DEPTH = 0.5
#: The repair of the built-in patterns' decision steps where nothing names one
#: (`EngineConfig.decision_repair`). A tree of thoughts' voters chose as the baseline
#: at 76% of their first positions unrepaired, 93% under it (docs/fidelity.md); the
#: voters over one set of proposals share one repair, so it costs about half of what
#: the baseline encodes for a whole run.
DECISION_REPAIR = "query:0.3"


@dataclass(frozen=True)
class Repair:
    """A repair policy: the first `first` tokens of each rewired parent, plus a share
    `ratio` of the rewired tokens by deviation, or every one (`full`); the rest read
    at attention `temperature`; with `serial`, the call's parents laid end to end
    first (its offsets and new_offset replaced)."""

    first: int = 0
    ratio: float = 0.0
    full: bool = False
    temperature: float = 1.0
    serial: bool = False
    query: float = 0.0  # a share chosen by the query's attention ("query:R")
    auto: bool = False  # "auto": the engine chooses the policy (corps.engine.auto_repair)
    # "auto:P": where auto starts a key it has not seen (a rung of `LADDER`; None: none)
    start: Repair | None = None
    cap: int | None = None  # "cap:N": at most N tokens recomputed (None: no cap)

    def __post_init__(self) -> None:
        shares = 0.0 <= self.ratio <= 1.0 and 0.0 <= self.query <= 1.0
        capped = self.cap is None or (not isinstance(self.cap, bool) and self.cap >= 0)
        if self.first < 0 or not shares or not 0.0 < self.temperature or not capped:
            raise InvalidRequest(
                "repair: first and cap must be >= 0, ratio and query in [0, 1] and temp > 0, "
                f"got {self!r}"
            )
        if self.ratio and self.query:
            raise InvalidRequest("repair: recompute:R and query:R are two ways to choose; pick one")
        chosen = self.first or self.share or self.full or self.serial or self.temperature != 1.0
        if self.auto and (chosen or self.cap is not None):
            raise InvalidRequest("repair 'auto' chooses the policy itself: give it alone")
        if self.start is not None and (not self.auto or self.start not in LADDER):
            raise InvalidRequest(
                "repair 'auto:P' starts auto at a rung of its ladder: P is one of "
                + ", ".join(map(str, LADDER))
            )

    @property
    def none(self) -> bool:
        """Nothing is recomputed or read at a temperature (`serial` may still have laid
        the context out)."""
        recomputes = (self.full or self.first or self.share) and self.cap != 0
        return not recomputes and self.temperature == 1.0

    def capped(self, most: int) -> Repair:
        """This policy recomputing at most `most` tokens (its own cap if lower)."""
        most = max(0, most) if self.cap is None else max(0, min(most, self.cap))
        return dataclasses.replace(self, cap=most)

    @property
    def share(self) -> float:
        """The share of the rewired tokens a probe chooses (by deviation or by query)."""
        return self.ratio or self.query

    @property
    def probes(self) -> bool:
        """Whether choosing the tokens needs a probe (deviation or query)."""
        return not self.full and 0.0 < self.share < 1.0

    def __str__(self) -> str:
        if self.auto:
            return "auto" if self.start is None else f"auto:{self.start}"
        serial = ["serial"] if self.serial else []
        cap = [f"cap:{self.cap}"] if self.cap is not None else []
        if self.full or self.ratio >= 1.0:
            return "+".join([*serial, "full", *cap])
        parts = (
            serial
            + ([f"first:{self.first}"] if self.first else [])
            + ([f"recompute:{self.ratio:g}"] if self.ratio else [])
            + ([f"query:{self.query:g}"] if self.query else [])
        )
        parts += [f"temp:{self.temperature:g}"] if self.temperature != 1.0 else []
        return "+".join(parts + cap if parts else []) or "none"


NONE = Repair()
#: "auto": the engine chooses per workflow and agent (corps.engine.auto_repair)
AUTO = Repair(auto=True)


def parse_repair(value: str | Repair | None) -> Repair:
    """A Repair from its string ("none", "first:4", "recompute:0.15", "full",
    "first:4+recompute:0.1", "serial+full"; "auto", or "auto:P" to start auto's new keys
    at rung P of `LADDER`), a Repair, or None (none). InvalidRequest says what it takes."""
    if value is None:
        return NONE
    if isinstance(value, Repair):
        return value
    if not isinstance(value, str):
        raise InvalidRequest(f"repair must be a string such as 'recompute:0.15', got {value!r}")
    if value.strip().lower() == "auto":
        return AUTO
    head, _, rest = value.strip().partition(":")
    if head.strip().lower() == "auto":  # "auto:P": auto, new keys starting at rung P
        start = _parse(rest, value)
        return AUTO if start == NONE else Repair(auto=True, start=start)
    return _parse(value)


def _parse(value: str, whole: str | None = None) -> Repair:
    """A Repair from parts joined by '+' (not "auto"); errors quote `whole` (the value
    given) when it is a part of it."""
    first, ratio, full, temperature, serial, query = 0, 0.0, False, 1.0, False, 0.0
    cap: int | None = None
    for part in value.strip().lower().split("+"):
        name, _, arg = part.strip().partition(":")
        try:
            if name == "none" and not arg:
                continue
            if name == "full" and not arg:
                full = True
            elif name == "serial" and not arg:
                serial = True
            elif name == "first" and int(arg) >= 0:
                first = max(first, int(arg))
            elif name == "cap" and int(arg) >= 0:
                cap = int(arg) if cap is None else min(cap, int(arg))
            elif name == "recompute" and 0.0 <= float(arg) <= 1.0:
                ratio = max(ratio, float(arg))
            elif name == "query" and 0.0 <= float(arg) <= 1.0:
                query = max(query, float(arg))
            elif name == "temp" and float(arg) > 0.0:
                temperature = float(arg)
            else:
                raise ValueError
        except ValueError:
            raise InvalidRequest(
                f"repair {whole or value!r}: each part is none, full, first:K (tokens), "
                "recompute:R or query:R (a share 0..1), temp:T (> 0), cap:N (tokens) or serial, "
                "joined by '+'; "
                "or 'auto' alone, or 'auto:P' with P a rung of auto's ladder"
            ) from None
    if ratio >= 1.0 or query >= 1.0:  # every rewired token
        full, ratio, query = True, 0.0, 0.0
    if full:  # nothing is left to read at a temperature
        first, temperature = 0, 1.0
    if not (full or first or ratio or query):  # nothing to cap
        cap = None
    return Repair(first, ratio, full, temperature, serial, query, cap=cap)


#: `repair="auto"`'s rungs, cheapest first (`corps.engine.auto_repair`): nothing; EPIC's
#: sink tokens; the query's most attended tenth and third; every rewired token.
LADDER: tuple[Repair, ...] = tuple(
    _parse(p) for p in ("none", "first:4", "query:0.15", "query:0.3", "full")
)
