"""Trace events: what an engine and its agents did, as typed events, to a JSON-lines file.

Every engine call, message, actor event, leak and error becomes one pydantic
event. An engine has one `Recorder`; sinks subscribe to it (the trace file,
the live view). With no sink nothing is built, so tracing costs nothing when
off. Events are emitted on the event loop only (never from the worker thread
that runs the forward step); times are `t`, seconds since the recorder was
made, from one monotonic clock, so events are comparable across sources.

The file (`TraceFile`) starts with a `Header` line (format, corps version,
model, mode, dtype, device), then one event per line, written line-buffered so
a crash loses at most the line being written and a viewer can tail it. A
message's text goes on its own `Text` line right after its `Message`, so a
reader can index a large trace and load texts lazily. This module imports no
torch: the viewer reads traces without loading a model.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

#: Bumped when a change to the events would mislead an older viewer.
TRACE_FORMAT = 1


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")
    t: float = 0.0  # seconds since the recorder started (monotonic)


class Header(_Event):
    """First line of every trace file: what produced it."""

    type: Literal["header"] = "header"
    format: int = TRACE_FORMAT
    corps: str = ""
    model: str = ""
    mode: str = ""
    dtype: str = ""
    device: str = ""
    started_unix: float = 0.0  # wall clock at t = 0 (for exports that need absolute time)
    policy: str = ""  # the scheduling policy (corps.engine.sched.policies); "" before it existed


class CallQueued(_Event):
    """A prefill or decode entered the engine's queue."""

    type: Literal["queued"] = "queued"
    call: int
    agent: str | None = None
    kind: str  # "prefill" or "decode"
    parents: list[int] = []
    offsets: list[int | None] | None = None  # as requested (None: the engine places)
    max_tokens: int | None = None
    workflow: str | None = None  # the workflow it was made in (corps.engine.request.workflow)
    group: int | None = None  # its task group: the id of the first call submitted with it
    objective: str | None = None  # "latency" or "throughput"
    critical: bool | None = None  # a latency call that bounds the batch (objective policy)


class FirstToken(_Event):
    """A decode sampled its first token."""

    type: Literal["first_token"] = "first_token"
    call: int


class CallEnd(_Event):
    """A call finished (`ok`), failed (`error`) or was cancelled; its figures."""

    type: Literal["end"] = "end"
    call: int
    agent: str | None = None
    kind: str
    status: Literal["ok", "error", "cancelled"]
    error: str | None = None
    message: int | None = None  # the message it made
    parents: list[int] = []
    offsets: list[int] = []  # where each parent sat (as placed)
    new_offset: int | None = None
    admitted: float | None = None  # t when its first step began
    first_token: float | None = None  # t of its first sampled token (decode)
    encoded: int = 0  # tokens run through the model
    reused: int = 0  # cached tokens attended to without re-encoding
    repaired: int = 0  # rewired context tokens recomputed in its context (encoded, not reused)
    # the repair policy it ran under: it recomputed `repaired` tokens, or (0) it read a
    # context another call had repaired alike (`corps.engine.exec.repairs`)
    repair: str | None = None
    generated: int = 0
    ttft_s: float | None = None
    decode_s: float | None = None


class MessageMade(_Event):
    """A message entered the store (its text follows on a `Text` line)."""

    type: Literal["message"] = "message"
    id: int
    role: str
    kind: str  # "prefill" or "decode"
    owner: str | None = None
    visibility: str = "public"
    parents: list[int] = []
    offsets: list[int] = []
    offset: int = 0
    tokens: int = 0
    sources: list[int] = []  # every message its encoding attended to, transitively
    call: int | None = None  # the call that made it
    view_of: int | None = None  # a re-encoded clean copy of this message
    view_for: str | None = None


class Text(_Event):
    """A message's content text."""

    type: Literal["text"] = "text"
    id: int
    text: str


class Freed(_Event):
    type: Literal["freed"] = "freed"
    id: int


class Step(_Event):
    """One fused forward step of the batching loop."""

    type: Literal["step"] = "step"
    dur: float
    calls: int  # calls in the step
    sampled: int  # tokens sampled
    store_used: int
    capacity: int
    queue: int
    rows: int = 0  # rows the step planned: decodes, prompt chunks, footers
    stepped: int = 0  # calls it ran rows of (a policy may leave running ones out)
    admit_s: float = 0.0  # of `dur`, before the forward: the thread hop and admitting
    # new calls (planning, gathering contexts, recomputing evicted parents)
    evicted: int = 0  # tokens whose encodings the step's admission evicted (preemption)
    recomputed: int = 0  # tokens of evicted encodings it made again to be read
    chunks: int = 0  # calls it ran a prompt chunk of (more than one row)
    keys: int = 0  # keys its decodes attended over (`exec.step_plan.decode_keys`)


class ActorEvent(_Event):
    """spawn, ask, send, reply, failure, restart, stop, dead_letter or tool (a tool an
    agent's model called: `detail` its name, and on failure the error's kind)."""

    type: Literal["actor"] = "actor"
    event: str
    agent: str
    peer: str | None = None  # the sender of an ask / send, the asker of a reply
    ask: int | None = None  # pairs an ask with its reply
    detail: str = ""
    ok: bool = True


class LeakEvent(_Event):
    """`reader`'s call attended to `parent`, whose encoding carries hidden `sources`."""

    type: Literal["leak"] = "leak"
    reader: str | None
    parent: int
    sources: list[int]
    call: str
    detail: str
    policy: str
    call_id: int | None = None  # the call that attended to it


class Reencode(_Event):
    """A leaking parent was re-encoded as a clean copy for one reader."""

    type: Literal["reencode"] = "reencode"
    message: int
    reader: str
    clean: int  # the copy's message id


class ErrorEvent(_Event):
    """Something failed outside a single call (the loop died, a runtime escalated)."""

    type: Literal["error"] = "error"
    where: str
    detail: str


class Stage(_Event):
    """A workflow entered a stage (a pattern's round, or the role it now asks), for
    viewers: `run` names the workflow (`debate-1a2b3c4d`)."""

    type: Literal["stage"] = "stage"
    run: str
    name: str


class Gate(_Event):
    """A workflow (a pattern's run, `run` as in `Stage`) passed the engine's workflow
    gate (`corps.engine.sched.gate`) at `t`, `waited` s after it arrived there."""

    type: Literal["gate"] = "gate"
    run: str
    waited: float = 0.0


class Process(_Event):
    """In a merged trace (`corps.engine.trace.merge`): the events that follow, up to the
    next `Process`, come from this engine process (a cluster's worker)."""

    type: Literal["process"] = "process"
    name: str
    pid: int | None = None
    host: str = ""


class Closed(_Event):
    """Last line of a trace whose engine shut down cleanly (absent after a crash)."""

    type: Literal["closed"] = "closed"


class Audited(_Event):
    """A decode was audited (`corps.engine.audit`): its first `positions` sampled
    positions compared with what the baseline's encoding (the `shadow` call) gives;
    `gap` the mean KL(baseline || choreographed) per position in nats, `agreement` the
    share of equal argmaxes, `tokens` what the shadow encoded. Its figures are kept
    under `workflow` (family), `agent` and `repair`."""

    type: Literal["audited"] = "audited"
    call: int
    shadow: int
    workflow: str = ""
    agent: str = ""
    repair: str = "none"
    positions: int = 0
    gap: float = 0.0
    agreement: float = 0.0
    tokens: int = 0


class RepairSwitch(_Event):
    """`repair="auto"` moved a workflow's agent from one policy to another
    (`corps.engine.auto_repair`): `why` is "high", "low" or "fell back", `gap` the
    smoothed audited gap that decided it."""

    type: Literal["repair_switch"] = "repair_switch"
    workflow: str = ""
    agent: str = ""
    before: str
    after: str
    gap: float
    why: str


class Token(_Event):
    """A sampled token, for live sinks only (never written to a trace file)."""

    type: Literal["token"] = "token"
    call: int
    token: int


Event = Annotated[
    Header
    | CallQueued
    | FirstToken
    | CallEnd
    | MessageMade
    | Text
    | Freed
    | Step
    | ActorEvent
    | LeakEvent
    | Reencode
    | ErrorEvent
    | Stage
    | Gate
    | Process
    | Closed
    | Audited
    | RepairSwitch
    | Token,
    Field(discriminator="type"),
]
EVENT = TypeAdapter(Event)
#: The `type` of every event this version writes.
EVENT_TYPES = frozenset(m.model_fields["type"].default for m in get_args(get_args(Event)[0]))

Sink = Callable[[BaseModel], None]


def version() -> str:
    try:
        return metadata.version("corps")
    except metadata.PackageNotFoundError:  # running from a source tree
        return "0+unknown"


def visibility_name(visibility: Any) -> str:
    """'public', 'private' or 'shared(a,b)' for a Visibility (None is public)."""
    if visibility is None:
        return "public"
    readers = getattr(visibility, "readers", None)
    if readers is not None:
        return f"shared({','.join(sorted(readers))})"
    return type(visibility).__name__.lower()


class Recorder:
    """Fans events out to sinks. `on` is False with no sink: callers skip building events.

    `tokens` is True when a sink asked for per-token events (the live view).
    """

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.started_unix = time.time()
        self._sinks: list[Sink] = []
        self._token_sinks: list[Sink] = []

    @property
    def on(self) -> bool:
        return bool(self._sinks)

    @property
    def tokens(self) -> bool:
        return bool(self._token_sinks)

    def add(self, sink: Sink, *, tokens: bool = False) -> None:
        """Send every event to `sink` (and `Token` events too if `tokens`)."""
        self._sinks.append(sink)
        if tokens:
            self._token_sinks.append(sink)

    def remove(self, sink: Sink) -> None:
        for sinks in (self._sinks, self._token_sinks):
            if sink in sinks:
                sinks.remove(sink)

    def rel(self, perf: float | None) -> float | None:
        """A `time.perf_counter()` reading as trace time."""
        return None if perf is None else perf - self.t0

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def emit(self, event: BaseModel) -> None:
        for sink in self._sinks:
            sink(event)

    def token(self, call: int, token: int) -> None:
        event = Token(t=self.now(), call=call, token=token)
        for sink in self._token_sinks:
            sink(event)


class TraceFile:
    """A sink writing events as JSON lines, one flushed line per event."""

    def __init__(self, path: str | Path, header: Header) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "w", encoding="utf-8", buffering=1)  # closed in close()
        self._f.write(header.model_dump_json() + "\n")

    def __call__(self, event: BaseModel) -> None:
        if self._f.closed:
            return
        self._f.write(event.model_dump_json() + "\n")

    def close(self, t: float) -> None:
        if not self._f.closed:
            self._f.write(Closed(t=t).model_dump_json() + "\n")
            self._f.close()
