"""The scheduling policies by name (`EngineConfig.policy`)."""

from __future__ import annotations

from typing import Any

from corps.engine.sched.fair import FairShare
from corps.engine.sched.policies import POLICIES, Fcfs, ObjectiveFirst, Policy, WorkflowFirst


def make(name: str, **settings: Any) -> Policy:
    """The policy called `name` ("fcfs", "workflow", "objective" or "fair")."""
    if name == "fcfs":
        return Fcfs()
    if name == "workflow":
        return WorkflowFirst(**settings)
    if name == "objective":
        return ObjectiveFirst(**settings)
    if name == "fair":
        return FairShare(**settings)
    raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {name!r}")
