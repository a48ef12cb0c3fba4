"""`Counts`: what an executor has done since it opened, counted by the part that did it.

One instance per executor, handed to its parts at construction: the step runner
counts what the forward encoded and how long it took, postprocess the tokens
jump-forward appended, the repair part what it recomputed and probed, the restorer
what it encoded again after an eviction. `EngineStats` reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

from corps.engine.exec.call import Call


@dataclass
class Counts:
    tokens_encoded: int = 0  # rows the model's forward ran
    tokens_reused: int = 0  # context tokens read from the store instead of encoded
    tokens_jumped: int = 0  # tokens constraints forced, appended without sampling
    tokens_recomputed: int = 0  # tokens of evicted encodings made again (`Restorer`)
    tokens_repaired: int = 0  # rewired context tokens recomputed (`Repairs`)
    tokens_probed: int = 0  # rewired tokens the repair's deviation probe ran
    forward_seconds: float = 0.0  # time spent in the model's forward

    def admitted(self, call: Call) -> None:
        """A call was admitted: what it reads, repairs and probes of its context."""
        self.tokens_reused += call.reused
        self.tokens_repaired += call.repaired
        self.tokens_probed += call.repair.probed if call.repair is not None else 0
