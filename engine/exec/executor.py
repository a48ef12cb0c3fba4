"""`Executor`: the step machine the batching loop drives, and the message
bookkeeping the engine uses. Two implementations: `KVExecutor` (choreographed and
baseline modes, over our KV store) and `HFExecutor` (transformers `generate`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence, Set
from pathlib import Path
from typing import Protocol

from corps.cache.durable import DurableStore
from corps.cache.handle import Handle
from corps.cache.messages import Message, MessageTable
from corps.engine.exec.call import Call
from corps.engine.exec.grammars import Grammars
from corps.engine.exec.step_plan import StepOutput, StepPlan
from corps.engine.request.chat_format import ChatFormat
from corps.engine.stats import EngineStats


class Executor(Protocol):
    mode: str
    precision: str  # the dtype name the engine was opened with
    model_path: Path
    max_positions: int  # the model's context length (logical positions)
    tokenizer: object
    fmt: ChatFormat
    table: MessageTable
    grammars: Grammars  # its compiled constraints and their masks
    device: object  # the torch device it runs on
    # the kernels measured on this CPU when the engine opened (dtype auto), else None
    kernel_choice: object
    # the precompiled decode step's package this engine would load but no one has
    # built yet (`model.precompiled_decode`), else None
    step_missing: Path | None
    # EngineConfig.store: where its messages outlive it (`keep_in`), else None
    durable: DurableStore | None

    def admit(
        self,
        call: Call,
        *,
        hold: bool = False,
        evict: Callable[[list[Message]], list[Message]] | None = None,
    ) -> Call | None:
        """Check and plan a queued call and take what it needs; atomic (a call that
        fails is back as queued, `Call.unplan`). None: admit it again after a step (it
        waits for a running call's prefix). `evict`: the order in which encodings no
        running call reads may be dropped to make room (None: never). The call keeps
        the pins it came with (`Call.pins`); one without pins its parents itself."""

    def step(self, order: StepPlan) -> StepOutput:
        """Run one step (`corps.engine.exec.step_plan`) in one pass: the rows of the
        order's calls planned and run; a `StepOutput` with the tokens sampled, the
        calls finished (their handles) and the calls that failed (rolled back)."""

    def abort(self, c: Call, keep_pins: bool = False) -> None:
        """Give back everything the call holds (but its pins, with `keep_pins`: a call
        that goes back to the queue); as if it never ran."""

    def pin(self, handles: Sequence[Handle | Message]) -> list[Message]:
        """Keep these messages' encodings until `unpin`, even if freed meanwhile: by
        handle (a live message, else UnknownHandle), or records already pinned."""

    def unpin(self, msgs: Sequence[Message]) -> None: ...

    def free(self, handle: Handle) -> None: ...

    def check(self) -> None:
        """BrokenInvariant unless the bookkeeping of an idle executor is exact."""

    def stats(self) -> EngineStats: ...

    def reset_peaks(self) -> None: ...

    def reset_prefix_cache(self) -> int:
        """Drop cached prefixes no call reads and the work bound's memory; tokens freed."""

    def prefetch(self, ids: Set[int]) -> int:
        """Copy these messages' evicted encodings back from the disk tier while the store
        has room for them without evicting anything; tokens copied (0 without a tier)."""

    def gauges(self) -> tuple[int, int, int, int]:
        """(store slots used, store capacity, tokens evicted, tokens recomputed)."""

    def close(self) -> None:
        """Give memory back (the engine closed); with a store, its encodings saved first."""

    def keep_in(self, store: DurableStore) -> None:
        """Read `store`'s messages back (before any call) and keep every message in it
        from now on (`corps.engine.exec.persist`)."""

    def kv_layout(self) -> list:
        """What its encodings' bytes depend on: [dtype, layers, KV heads, head dim]."""
