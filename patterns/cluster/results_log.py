"""The JSON-lines file a run over many inputs streams its results to, one line per input.

Each line is `{"id": ..., "index": ..., "result": {...}}` or, for an input whose
workflow failed, `{"id": ..., "index": ..., "error": "..."}`, plus whatever the
writer adds (worker, attempts). Lines are appended and flushed as results
arrive, so an interrupted run loses only what was still running. Resuming
keeps the lines with a result, drops failed ones (they run again) and a torn
last line, and says which ids are done: every id ends with exactly one line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

Id = int | str


class ResultLog:
    """`ResultLog(path, resume=...)`; `done` holds the ids already there; `write(line)`."""

    def __init__(self, path: str | Path, *, resume: bool = False) -> None:
        self.path = Path(path)
        self.done: set[Id] = set()
        self.dropped = 0  # failed or torn lines removed on resume
        kept: list[str] = []
        if resume and self.path.exists():
            for raw in self.path.read_text().splitlines():
                line = _parse(raw)
                if line is None or "result" not in line or line.get("id") in self.done:
                    self.dropped += raw.strip() != ""
                    continue
                self.done.add(line["id"])
                kept.append(raw)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(k + "\n" for k in kept))
        os.replace(tmp, self.path)  # the file holds complete result lines only, or nothing
        self._file = self.path.open("a")

    def write(self, line: dict[str, Any]) -> None:
        self._file.write(json.dumps(line) + "\n")
        self._file.flush()
        if "result" in line:
            self.done.add(line["id"])

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> ResultLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _parse(raw: str) -> dict[str, Any] | None:
    try:
        line = json.loads(raw)
    except ValueError:
        return None
    return line if isinstance(line, dict) and "id" in line else None
