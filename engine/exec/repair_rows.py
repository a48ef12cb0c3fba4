"""A call's repair state: the context tokens it recomputes before its prompt
(`RepairRows`) and, while a deviation probe has still to choose them, what it
chooses among (`Probe`). `corps.engine.exec.repairs` fills them in; the step
plan budgets their rows, postprocess counts them as they run."""

from __future__ import annotations

from dataclasses import dataclass, field

from corps.engine.repair import Repair


@dataclass(frozen=True)
class Query:
    """The rows a query probe ("query:R") scores attention from: the end of what the
    call reads. `at` is each row's view index (one past the context for the call's
    own new tokens, which see the whole context)."""

    ids: list[int]
    positions: list[int]
    at: list[int]


@dataclass
class Probe:
    """What a share by deviation or by query chooses among, at the call's first step
    (`Repairs.probe`)."""

    every: list[int]  # view indices of every rewired token (the probe runs them all)
    ids: list[int]  # their token ids
    positions: list[int]  # their positions in the call's context
    fixed: list[int]  # view indices chosen without it (the first K of each parent)
    k: int  # how many more it picks among the others: those that score highest
    query: Query | None = None  # by the query's attention, else by deviation


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
    cut: int = 0  # tokens the policy chose that its cap left out (`Repair.cap`)
    done: int = 0  # rows run so far

    @property
    def left(self) -> int:
        return self.total - self.done

    def take(self, at: list[int], tokens: dict[int, int], positions: dict[int, int]) -> None:
        """Recompute the tokens at view indices `at`, in view order."""
        self.at = sorted(at)
        self.ids = [tokens[j] for j in self.at]
        self.positions = [positions[j] for j in self.at]
