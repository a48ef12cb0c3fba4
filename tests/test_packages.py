"""The packages' __init__ files: each public name exported once, by the package that owns it."""

from __future__ import annotations

import importlib

import pytest

EXPORTS = {
    "corps.cache": [
        "AccessDenied",
        "BrokenInvariant",
        "CacheFullError",
        "CallFigures",
        "CorpsError",
        "ForeignHandle",
        "Handle",
        "InvalidRequest",
        "Leak",
        "LeakWarning",
        "LeakageError",
        "PositionError",
        "Private",
        "Public",
        "Shared",
        "StoreTooSmall",
        "UnknownHandle",
        "ViewsFull",
    ],
    "corps.engine": [
        "AUDIT_POSITIONS",
        "AccessEvent",
        "AuditEvent",
        "AuditKey",
        "AuditReport",
        "AuditRow",
        "AwaitingInput",
        "BadConfig",
        "CallCancelled",
        "ChatFormat",
        "ConstraintViolated",
        "DECISION_REPAIR",
        "DecodeArgs",
        "DecodeRequest",
        "Engine",
        "EngineBusy",
        "EngineClosed",
        "EngineConfig",
        "EngineStats",
        "FetchError",
        "InvalidConstraint",
        "JSON_LAYOUT",
        "ModelNotFound",
        "NonFiniteLogits",
        "Pending",
        "PrefillArgs",
        "PrefillRequest",
        "Repair",
        "SamplingParams",
        "Selection",
        "TextStream",
        "UnsupportedModel",
    ],
    "corps.agents": [
        "DEAD_LETTERS",
        "Agent",
        "AgentError",
        "AgentRuntime",
        "AgentStopped",
        "AskTimeout",
        "DeadLetter",
        "IncompleteReply",
        "MailboxFull",
        "Runtime",
        "UnknownAgent",
    ],
    "corps.patterns": [
        "PATTERNS",
        "BadParameters",
        "PatternResult",
        "UnknownPattern",
        "branch_solve_merge",
        "debate",
        "map_reduce",
        "multi_qa",
        "parallel_debate",
        "prisoners_dilemma",
        "run_pattern",
        "tree_of_thoughts",
    ],
}


@pytest.mark.parametrize("package", sorted(EXPORTS))
def test_each_package_exports_exactly_its_public_names(package):
    mod = importlib.import_module(package)
    assert sorted(mod.__all__) == sorted(EXPORTS[package])
    for name in mod.__all__:
        assert getattr(mod, name) is not None


def test_no_name_is_exported_by_two_packages():
    seen: dict[str, str] = {}
    for package, names in EXPORTS.items():
        for name in names:
            assert name not in seen, f"{name} exported by {seen.get(name)} and {package}"
            seen[name] = package
