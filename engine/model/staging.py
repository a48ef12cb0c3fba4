"""Model directories written whole or not at all: built in a scratch folder beside
their place, then renamed into it (atomic), so a concurrent process sees nothing or
the finished directory."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def staged(target: Path, prefix: str, done: Callable[[Path], bool]) -> Iterator[Path]:
    """A scratch folder beside `target`; write the directory to its `model` child. On
    leaving, that becomes `target` (if another process finished first, `done(target)`
    says so and its copy stays); the scratch goes either way."""
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=prefix, dir=target.parent))
    try:
        yield work
        try:
            os.rename(work / "model", target)  # atomic; fails if another process finished
        except OSError:
            if not done(target):
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
