"""Reading a trace file: events indexed by call and message, texts loaded lazily.

`Trace.load(path)` reads the whole file; `trace.update()` reads what was
appended since (for `--follow`). A message's text is not parsed while loading:
its line's byte offset is kept and `trace.text(id)` reads it on demand, so a
100k-event trace loads without holding every text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from corps.engine.trace.events import (
    EVENT,
    EVENT_TYPES,
    TRACE_FORMAT,
    ActorEvent,
    Audited,
    CallEnd,
    CallQueued,
    Closed,
    ErrorEvent,
    FirstToken,
    Freed,
    Gate,
    Header,
    LeakEvent,
    MessageMade,
    Process,
    Reencode,
    RepairSwitch,
    Stage,
    Step,
)

_TEXT = re.compile(rb'^\{"t":[^,]*,"type":"text","id":(\d+),')


class TraceError(Exception):
    """The file is not a corps trace this version can read (one line saying why)."""


@dataclass
class CallRec:
    """One call as the trace saw it: queued, maybe its first token, maybe its end."""

    queued: CallQueued
    first_token: float | None = None
    end: CallEnd | None = None
    process: str | None = None  # the engine process it ran in (merged traces only)

    @property
    def id(self) -> int:
        return self.queued.call

    @property
    def agent(self) -> str | None:
        return self.queued.agent

    @property
    def kind(self) -> str:
        return self.queued.kind

    @property
    def status(self) -> str:
        return "pending" if self.end is None else self.end.status

    @property
    def start(self) -> float:
        return self.queued.t

    @property
    def admitted(self) -> float | None:
        return None if self.end is None else self.end.admitted

    @property
    def first(self) -> float | None:
        return self.end.first_token if self.end is not None else self.first_token

    def stop(self, now: float) -> float:
        """When it ended (`now` while pending)."""
        return now if self.end is None else self.end.t


@dataclass
class Trace:
    path: Path
    header: Header
    calls: dict[int, CallRec] = field(default_factory=dict)
    messages: dict[int, MessageMade] = field(default_factory=dict)
    freed: dict[int, float] = field(default_factory=dict)
    actors: list[ActorEvent] = field(default_factory=list)
    leaks: list[LeakEvent] = field(default_factory=list)
    audits: dict[int, Audited] = field(default_factory=dict)  # audited call -> its audit
    switches: list[RepairSwitch] = field(default_factory=list)  # repair="auto"'s moves
    reencodes: list[Reencode] = field(default_factory=list)
    errors: list[ErrorEvent] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    stages: list[Stage] = field(default_factory=list)  # what each workflow said it was doing
    gates: dict[str, Gate] = field(default_factory=dict)  # run -> its pass through the gate
    processes: list[Process] = field(default_factory=list)  # a merged trace's engines
    step_processes: list[str | None] = field(default_factory=list)  # each step's process
    warnings: list[str] = field(default_factory=list)
    events: int = 0
    last_t: float = 0.0
    closed: bool = False  # the engine shut down cleanly (its last line was written)
    _texts: dict[int, int] = field(default_factory=dict)  # message id -> byte offset
    _pos: int = 0  # bytes read so far (complete lines only)
    _line: int = 1

    # ---- loading ----

    @classmethod
    def load(cls, path: str | Path, *, follow: bool = False) -> Trace:
        """Read a trace; TraceError if it is not one. A truncated last line is skipped
        with a warning (with `follow`, it is left for `update` to finish)."""
        path = Path(path)
        if not path.is_file():
            raise TraceError(f"no trace file {str(path)!r}")
        with path.open("rb") as f:
            first = f.readline()
        if not first.endswith(b"\n") and not follow:
            raise TraceError(f"{path} is not a corps trace: no complete header line")
        header = _header(first, path)
        trace = cls(path, header, _pos=len(first), _line=2)
        trace.update(final=not follow)
        return trace

    def update(self, *, final: bool = False) -> int:
        """Read complete lines appended since the last read; how many events.

        A last line without its newline is a line still being written: it is left
        for the next update, unless `final`, when it is skipped with a warning.
        """
        n = 0
        with self.path.open("rb") as f:
            f.seek(self._pos)
            while True:
                line = f.readline()
                if not line:
                    break
                if not line.endswith(b"\n"):
                    if final:
                        self.warnings.append(
                            f"line {self._line}: truncated last line skipped "
                            f"(the run was interrupted or is still writing)"
                        )
                        self._pos += len(line)
                    break
                self._read(line, self._pos)
                self._pos += len(line)
                self._line += 1
                n += 1
        return n

    def _read(self, line: bytes, pos: int) -> None:
        m = _TEXT.match(line)
        if m is not None:  # a message text: remember where, parse when asked
            self._texts[int(m.group(1))] = pos
            self.events += 1
            return
        if not line.strip():
            return
        try:
            event = EVENT.validate_json(line)
        except ValidationError as exc:
            if _unknown_type(line):
                self.warnings.append(f"line {self._line}: unknown event skipped")
                return
            raise TraceError(
                f"{self.path}: line {self._line} is not a corps trace event "
                f"({exc.errors()[0]['msg']})"
            ) from None
        self.events += 1
        self.last_t = max(self.last_t, event.t)
        self._add(event)

    def _add(self, event) -> None:
        process = self.processes[-1].name if self.processes else None
        if isinstance(event, CallQueued):
            self.calls[event.call] = CallRec(event, process=process)
        elif isinstance(event, FirstToken):
            if event.call in self.calls:
                self.calls[event.call].first_token = event.t
        elif isinstance(event, CallEnd):
            rec = self.calls.get(event.call)
            if rec is None:  # queued before the trace began: synthesise its start
                rec = self.calls[event.call] = CallRec(
                    CallQueued(t=event.t, call=event.call, agent=event.agent, kind=event.kind),
                    process=process,
                )
            rec.end = event
        elif isinstance(event, MessageMade):
            self.messages[event.id] = event
        elif isinstance(event, Freed):
            self.freed[event.id] = event.t
        elif isinstance(event, ActorEvent):
            self.actors.append(event)
        elif isinstance(event, LeakEvent):
            self.leaks.append(event)
        elif isinstance(event, Reencode):
            self.reencodes.append(event)
        elif isinstance(event, Audited):
            self.audits[event.call] = event
        elif isinstance(event, RepairSwitch):
            self.switches.append(event)
        elif isinstance(event, ErrorEvent):
            self.errors.append(event)
        elif isinstance(event, Step):
            self.steps.append(event)
            self.step_processes.append(process)
        elif isinstance(event, Process):
            self.processes.append(event)
        elif isinstance(event, Stage):
            self.stages.append(event)
        elif isinstance(event, Gate):
            self.gates[event.run] = event
        elif isinstance(event, Closed):
            self.closed = True

    # ---- lookups ----

    def text(self, mid: int) -> str:
        """A message's text, read from the file now ('' if the trace has none)."""
        pos = self._texts.get(mid)
        if pos is None:
            return ""
        with self.path.open("rb") as f:
            f.seek(pos)
            return json.loads(f.readline())["text"]

    def producer(self, mid: int) -> CallRec | None:
        """The call that made message `mid`."""
        msg = self.messages.get(mid)
        return None if msg is None or msg.call is None else self.calls.get(msg.call)

    @property
    def end_t(self) -> float:
        return self.last_t


def _header(first: bytes, path: Path) -> Header:
    try:
        obj = json.loads(first)
    except ValueError:
        raise TraceError(f"{path} is not a corps trace: its first line is not JSON") from None
    if not isinstance(obj, dict) or obj.get("type") != "header":
        raise TraceError(f"{path} is not a corps trace: it does not start with a header line")
    fmt = obj.get("format")
    if not isinstance(fmt, int) or fmt > TRACE_FORMAT or fmt < 1:
        raise TraceError(
            f"{path} is trace format {fmt!r}; this corps reads format {TRACE_FORMAT}: "
            f"upgrade corps to view it"
        )
    return Header.model_validate(obj)


def _unknown_type(line: bytes) -> bool:
    """A JSON event of a type this version does not know (written by a newer corps)."""
    try:
        obj = json.loads(line)
    except ValueError:
        return False
    kind = obj.get("type") if isinstance(obj, dict) else None
    return isinstance(kind, str) and kind not in EVENT_TYPES


_RUN = re.compile(r"^(?P<pattern>.+)-(?P<run>[0-9a-f]{8})-(?P<role>.+)$")


class Names:
    """Short agent names: a pattern's `debate-1a2b3c4d-alice` shows as `alice`
    (as `1a2b3c4d/alice` when the trace holds several runs)."""

    def __init__(self, agents: Iterable[str | None]) -> None:
        runs = {m["run"] for a in agents if a and (m := _RUN.match(a))}
        self.several = len(runs) > 1

    def __call__(self, agent: str | None) -> str:
        if agent is None:
            return "(engine)"
        m = _RUN.match(agent)
        if m is None:
            return agent
        return f"{m['run']}/{m['role']}" if self.several else m["role"]

    def lane(self, call: CallRec) -> str:
        """A call's agent as `__call__` names it, after its process in a merged trace
        (`w2 alice` for worker-2's alice)."""
        name = self(call.agent)
        return f"{short_process(call.process)} {name}" if call.process else name

    @staticmethod
    def run(agent: str | None) -> str | None:
        """The run id in a pattern agent's name (`debate-1a2b3c4d-alice`), else None."""
        m = _RUN.match(agent) if agent else None
        return m["run"] if m else None


def short_process(process: str) -> str:
    """A process's name as lanes show it: `worker-12` as `w12` (labels are narrow)."""
    head, _, n = process.rpartition("-")
    return f"{head[:1]}{n}" if head and n.isdigit() else process


def names_of(trace: Trace) -> Names:
    return Names(
        [c.agent for c in trace.calls.values()] + [m.owner for m in trace.messages.values()]
    )
