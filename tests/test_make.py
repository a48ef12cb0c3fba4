"""engine/sched/make.py: every policy by its name, and a clear error for another."""

from __future__ import annotations

import pytest

from corps.engine.sched.make import make


def test_make_names_every_policy():
    assert [make(n).name for n in ("fcfs", "workflow", "objective", "fair")] == [
        "fcfs",
        "workflow",
        "objective",
        "fair",
    ]
    with pytest.raises(ValueError, match="policy must be one of"):
        make("random")
