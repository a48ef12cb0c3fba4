"""Building an engine's precompiled decode step in a background process.

An engine opened with `precompiled="auto"` whose package is not kept yet decodes
eagerly and starts a Python process (`_BOOT`), its config on stdin, in a session
of its own: it waits until the engine's process has exited (its stdin ends), then
opens the same config with `precompiled="build"`, which builds the package, and
exits. It waits because building beside a running
engine slowed it 15-40x on a 2-core EPYC for the minute the build took, even
with the build at SCHED_IDLE; so the process that asked for a package never gets
it, the next one does. One build per package at a time: a lock file beside it
holds the building process's id, and a lock whose process is gone is taken over.
The build's output goes to a log beside the package.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from corps.engine.config import EngineConfig

#: Builds started by this process: each waits for the end of its stdin (this
#: process's exit) before it starts.
_WAITING: list[subprocess.Popen] = []
#: The child's first lines: the config, then the wait, before torch is imported (an
#: import of torch beside the engine costs its decode seconds).
_BOOT = (
    "import sys; cfg = sys.stdin.readline(); sys.stdin.read(); "
    "from corps.engine.api.build import build_in_background as b; sys.exit(b(sys.argv[1], cfg))"
)


def spawn_build(cfg: EngineConfig, package: Path, console: Console | None = None) -> bool:
    """Start building `package` for engines of `cfg` in a background process, unless
    one is building it already; whether one was started. A cache it cannot write
    (a read-only home) starts nothing: the engine decodes eagerly as before."""
    lock = package.with_suffix(".lock")
    try:
        package.parent.mkdir(parents=True, exist_ok=True)
        if not _take(lock):
            return False
    except OSError:
        return False
    child = cfg.model_copy(update={"precompiled": "build", "otel": None})
    log = package.with_suffix(".log")
    try:
        with log.open("w") as out:
            proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT, str(lock)],
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc.stdin.write(child.model_dump_json().encode() + b"\n")
        proc.stdin.flush()
    except OSError:
        lock.unlink(missing_ok=True)
        return False
    _WAITING.append(proc)  # its stdin stays open until this process ends
    if lock.exists():  # the build may be over already (it removes the lock)
        lock.write_text(str(proc.pid))
    if console is not None:
        console.print(
            "[dim]once this command exits, the decode step is compiled for this CPU in the "
            f"background (once, about a minute; {package.parent}): later runs decode faster[/]"
        )
    return True


def _take(lock: Path) -> bool:
    """Create `lock`, or take it over from a build that is gone."""
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            if _alive(lock):
                return False
            lock.unlink(missing_ok=True)
            continue
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        return True
    return False


def _alive(lock: Path) -> bool:
    """Whether the build that holds `lock` still runs."""
    try:
        pid = int(lock.read_text() or "0")
    except (OSError, ValueError):
        return False
    if pid <= 0:
        return True  # being written by the process that just created it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def idle() -> None:
    """Run (this process and what it starts: threads, compilers) at the lowest
    priority, beside whatever the user runs next: SCHED_IDLE on Linux, else nice 19."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        os.nice(19)
