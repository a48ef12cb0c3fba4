"""`StepPlan`: what one fused forward step runs, decided in one place.

The scheduling layer plans, the executor runs, postprocess updates the calls:

- `corps.engine.sched.step.plan_step(running, policy, budget)` asks the policy
  which running calls the next step advances and how many tokens it may run: a
  `StepPlan` without rows yet. The executor's `plan_rows` (here) decides the rows
  of each: a token for every decoding call first, then prompt chunks.
- `Executor.step(step)` plans the rows, allocates their slots, builds the batch, runs the
  forward, samples, moves each call on (postprocess), registers the messages of
  the calls that are done, and returns all of it as one `StepOutput`; the loop
  hands the tokens and handles to the calls' callers without calling back in.

Nothing else decides a step's shape: the batching loop, recomputes of evicted
encodings and the attention sink all step through a plan. Rules (unchanged from
when `KVExecutor.step` decided them):

- Decoding calls go first, so a long prefill never starves them; a decoding
  call brings its pending token, the tokens jump-forward appended after it, and
  when it is finishing the footer that closes its turn (`Call.next_rows`).
- Prompt chunks (at most `chunk` tokens each: `PREFILL_CHUNK` on a CPU,
  `GPU_PREFILL_CHUNK` on a GPU, `prefill_chunk_for`) fill what is left of the
  budget in the order given, and always get 1/`PREFILL_SHARE` of it while any
  call is prefilling (so decodes never starve prefills either).
- A recompute (`Call.first_spans`) encodes its feed in the spans it was first
  encoded in; a span that does not fit what is left waits a step.
- A repaired call (`corps.engine.exec.repairs`) runs its repair rows before its
  prompt, as prompt chunks are run (in order, chunks of at most `chunk`); its
  prompt's first chunk may follow them in the same step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from corps.cache.handle import Handle
from corps.engine.config import STEP_TOKENS, step_tokens_for
from corps.engine.exec.call import PREFILL_CHUNK, Call
from corps.engine.model.static_decode import BUCKETS, bucket_for

#: Longest piece of one call's prompt encoded in a single forward step: as many tokens
#: as a default step holds on the device (`corps.engine.config.STEP_TOKENS`: few on a
#: CPU, where a step costs what its rows do; a few thousand on a GPU, where it costs
#: its launches), so one call's prompt may fill a step.
GPU_PREFILL_CHUNK = STEP_TOKENS["cuda"]
#: While calls are prefilling, they get at least 1/PREFILL_SHARE of each step's tokens.
PREFILL_SHARE = 8
#: `Rows.start` of a decoding call's pending token (and what follows it).
PENDING = -1
#: `Rows.start` of a call's repair rows (`corps.engine.exec.repairs`).
REPAIR = -2

NO_BUDGET = 1 << 62
__all__ = [
    "BUCKETS",
    "PENDING",
    "REPAIR",
    "Rows",
    "StepOutput",
    "StepPlan",
    "plan_rows",
    "prefill_chunk_for",
]


@dataclass
class StepOutput:
    """One step's record. What it did, in one pass (the executor's): the tokens
    sampled, the calls it finished with their messages' handles, and the calls that
    failed (already rolled back). When and around what it ran (the loop's, for its
    figures and the trace's step event, `corps.engine.sched.stepped`)."""

    tokens: list[tuple[Call, int]] = field(default_factory=list)
    failed: list[tuple[Call, BaseException]] = field(default_factory=list)
    finished: dict[Call, Handle] = field(default_factory=dict)  # by call (identity)
    forward_s: float = 0.0  # the model's forward inside the step
    ran: bool = True  # False: the forward itself failed (every call of the step in failed)
    encoded: bool = False  # it ran a prompt chunk or a turn's footer, not only decodes
    calls: int = 0  # calls the forward ran rows of
    rows: int = 0  # rows (tokens) the forward encoded
    chunks: int = 0  # calls of those that encoded a prompt chunk (not one token)
    keys: int = 0  # keys its one-row calls attended over (`decode_keys`)
    # ---- the loop's (corps.engine.sched.scheduler) ----
    t0: float = 0.0  # when it began (the first of a run ahead: when the loop handed it over)
    end: float = 0.0  # when it ended (the last of a run ahead: when the loop took it back)
    admit_s: float = 0.0  # seconds before its forward (admission)
    running: int = 0  # calls running or ended at its end
    queue: int = 0  # calls queued or held at its end
    gauges: tuple[int, ...] = ()  # the executor's gauges at its end
    fed_back: bool = False  # the policy had its wall time on the torch thread (run ahead)


class Rows(NamedTuple):
    """One call's rows in a step: `n` tokens of its feed from `start`, or with start
    -1 its pending token, any tokens it jumped to and, if finishing, its footer.
    A tuple (call, start, n), as the batch builder unpacks it (a step unpacks each
    a few times: a dataclass's Python `__iter__` cost ~25 us a step at 16 calls)."""

    call: Call
    start: int
    n: int

    @property
    def is_chunk(self) -> bool:
        """A piece of the call's prompt (its feed), not its sampled token."""
        return self.start >= 0

    @property
    def is_decode(self) -> bool:
        """The call's pending sampled token (what it jumped to, its footer)."""
        return self.start == PENDING

    @property
    def is_repair(self) -> bool:
        """Rows recomputing tokens of the call's context (`RepairRows`)."""
        return self.start == REPAIR


@dataclass(frozen=True)
class StepPlan:
    """One step: the running calls the policy chose, in step order (`calls`; an
    executor that does not batch rows, `HFExecutor`, runs the first of them); the
    tokens it may run (`budget`, None: no bound); calls done before it (`ready`: a
    prefill that stores its text only), whose messages it registers; and the rows
    the executor lays out for it (`entries`, `plan_rows`: in batch order, decodes
    first, then prompt chunks). The loop plans the first three (`sched.step`); a
    plan is true once it has rows."""

    entries: tuple[Rows, ...] = ()
    calls: tuple[Call, ...] = ()
    budget: int | None = None
    ready: tuple[Call, ...] = ()

    @property
    def rows(self) -> int:
        return sum(e.n for e in self.entries)

    @property
    def chunks(self) -> int:
        """Entries that encode a prompt chunk."""
        return sum(e.is_chunk for e in self.entries)

    @property
    def bucket(self) -> int | None:
        """The static batch size a decode-only step of one row per call fits (the
        smallest of `BUCKETS` >= its rows); None for a step that encodes prompt
        chunks, jumped tokens or footers, or is larger than every bucket: those
        run with their exact shapes."""
        if not self.entries or any(not e.is_decode or e.n != 1 for e in self.entries):
            return None
        return bucket_for(len(self.entries))

    def __bool__(self) -> bool:
        return bool(self.entries)


def prefill_chunk_for(device: object) -> int:
    """The longest prompt chunk of one call in a step on `device`."""
    return step_tokens_for(str(device))


def plan_rows(
    calls: Sequence[Call], budget: int | None = None, chunk: int = PREFILL_CHUNK
) -> StepPlan:
    """The rows of the next step over `calls` (in the order given) within `budget`
    tokens (None: no bound), each call's prompt in chunks of at most `chunk` tokens.
    Pure: reads the calls, changes nothing."""
    left = NO_BUDGET if budget is None else budget
    decoding = [c for c in calls if c.pending is not None]
    prefilling = sum(len(c.feed) - c.fed + repair_left(c) for c in calls if c.pending is None)
    # prompt chunks keep a share of every step; decodes past the rest wait one step
    decodes = left - min(prefilling, max(1, left // PREFILL_SHARE))
    entries: list[Rows] = []
    for c in decoding:
        if decodes <= 0:
            break
        n = c.next_rows()
        decodes -= n
        entries.append(Rows(c, PENDING, n))
        left -= n
    for c in calls:
        if c.pending is not None or left <= 0:
            continue
        if repair_left(c):  # before its prompt: the prompt attends to what it repairs
            n = min(c.next_rows(chunk), left)
            entries.append(Rows(c, REPAIR, n))
            left -= n
            if n < repair_left(c) or left <= 0:
                continue
            # its prompt may follow in the same step: attention runs a call's spans in
            # order, layer by layer, so the prompt reads the recomputed encodings
        if c.fed >= len(c.feed):
            continue
        n = c.next_chunk(chunk) if c.first_spans else min(c.next_chunk(chunk), left)
        if n > left:
            continue  # a recompute's span waits for a step with room for it whole
        entries.append(Rows(c, c.fed, n))
        left -= n
    return StepPlan(tuple(entries), tuple(calls))


def repair_left(c: Call) -> int:
    """Repair rows the call has still to run."""
    return c.repair.left if c.repair is not None else 0


def decode_keys(lengths: list[int]) -> int:
    """Keys a step's decodes attend over, from each one's view length (context and
    own tokens). Their sum: the torch backend splits a step's decodes into plans of
    similar lengths (`corps.engine.attention.routing.split_by_length`), so padding
    each to the longest in its plan adds little."""
    return sum(lengths)
