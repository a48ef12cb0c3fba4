"""Several engines' traces as one file: one section per process, ids made unique.

A cluster's workers (`corps.patterns.cluster.runner`) each write their own trace; at the
end the driver merges them with `merge`. The merged file is an ordinary trace:
one header, then per worker a `Process` event and that worker's events, their
times moved onto one clock (the earliest worker's start is t = 0) and their
call, message and ask ids shifted so no two processes share one. Viewers and
exports show one process lane per worker (`CallRec.process`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from corps.engine.trace.events import Closed, Process

# which fields of each event type hold call / message / ask ids (single or lists)
_CALLS = {"queued": ("call", "group"), "first_token": ("call",), "end": ("call",),
          "message": ("call",), "leak": ("call_id",), "audited": ("call", "shadow")}  # fmt: skip
_MESSAGES = {
    "queued": ("parents",),
    "end": ("message", "parents"),
    "message": ("id", "parents", "sources", "view_of"),
    "text": ("id",),
    "freed": ("id",),
    "leak": ("parent", "sources"),
    "reencode": ("message", "clean"),
}
_ASKS = {"actor": ("ask",)}


def merge(
    traces: Mapping[str, str], out: str | Path, info: Mapping[str, Mapping[str, Any]] = {}
) -> None:
    """Write the traces (process name -> a trace file's text) as one trace at `out`;
    `info[name]` may give a process's pid and host."""
    sections = [(name, _lines(text)) for name, text in traces.items()]
    sections = [(name, lines) for name, lines in sections if lines]
    if not sections:
        raise ValueError("no traces to merge")
    t0 = min(lines[0].get("started_unix", 0.0) for _, lines in sections)
    header = dict(sections[0][1][0], started_unix=t0)
    shift = {"call": 0, "message": 0, "ask": 0}
    closed = True
    with Path(out).open("w") as f:
        f.write(_dump(header))
        for name, lines in sections:
            dt = lines[0].get("started_unix", t0) - t0
            meta = info.get(name, {})
            proc = Process(t=dt, name=name, pid=meta.get("pid"), host=meta.get("host", ""))
            f.write(proc.model_dump_json() + "\n")
            top = {"call": -1, "message": -1, "ask": -1}
            closed &= any(e.get("type") == "closed" for e in lines)
            for event in lines[1:]:
                if event.get("type") in ("header", "closed"):
                    continue
                event["t"] = event.get("t", 0.0) + dt
                for kind, table in (("call", _CALLS), ("message", _MESSAGES), ("ask", _ASKS)):
                    for key in table.get(event.get("type"), ()):
                        event[key] = _shifted(event.get(key), shift[kind], top, kind)
                f.write(_dump(event))
            for kind in shift:
                shift[kind] += top[kind] + 1
        if closed:
            last = max((e.get("t", 0.0) + lines[0].get("started_unix", t0) - t0)
                       for _, lines in sections for e in lines[-1:])  # fmt: skip
            f.write(Closed(t=last).model_dump_json() + "\n")


def _lines(text: str) -> list[dict[str, Any]]:
    """A trace's events; a torn last line (a killed worker's) is left out."""
    out = []
    for raw in text.splitlines():
        try:
            out.append(json.loads(raw))
        except ValueError:
            continue
    return out if out and out[0].get("type") == "header" else []


def _shifted(value: Any, by: int, top: dict[str, int], kind: str) -> Any:
    if value is None:
        return None
    if isinstance(value, list):
        return [_shifted(v, by, top, kind) for v in value]
    top[kind] = max(top[kind], value)
    return value + by


def _dump(event: dict[str, Any]) -> str:
    # compact, keys in their order: the loader finds text lines by their prefix
    return json.dumps(event, separators=(",", ":")) + "\n"
