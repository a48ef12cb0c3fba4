"""corps.engine: model loading, our forward over HF weights, sampling, and the public Engine.

Names are imported on first use, so `corps.engine.trace.events` (and the trace viewer)
and `corps.engine.config` load without torch. Handles, visibilities and the
base errors (`CorpsError`, `InvalidRequest`) are `corps.cache`'s.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

_HOME = {
    "AccessEvent": "corps.engine.api.access",
    "AuditEvent": "corps.engine.api.access",
    "BadConfig": "corps.engine.config",
    "EngineConfig": "corps.engine.config",
    "Engine": "corps.engine.api.engine",
    "Pending": "corps.engine.api.pending",
    "TextStream": "corps.engine.api.stream",
    "AwaitingInput": "corps.engine.errors",
    "CallCancelled": "corps.engine.errors",
    "ConstraintViolated": "corps.engine.errors",
    "InvalidConstraint": "corps.engine.errors",
    "Selection": "corps.engine.api.select",
    "ChatFormat": "corps.engine.request.chat_format",
    "EngineBusy": "corps.engine.errors",
    "EngineClosed": "corps.engine.errors",
    "FetchError": "corps.engine.errors",
    "ModelNotFound": "corps.engine.errors",
    "NonFiniteLogits": "corps.engine.errors",
    "UnsupportedModel": "corps.engine.errors",
    "DecodeArgs": "corps.engine.request.requests",
    "DecodeRequest": "corps.engine.request.requests",
    "PrefillArgs": "corps.engine.request.requests",
    "PrefillRequest": "corps.engine.request.requests",
    "SamplingParams": "corps.engine.request.sampling_params",
    "EngineStats": "corps.engine.stats",
    "Repair": "corps.engine.repair",
    "DECISION_REPAIR": "corps.engine.repair",
    "JSON_LAYOUT": "corps.engine.request.constraint",
    "AUDIT_POSITIONS": "corps.engine.audit",
    "AuditKey": "corps.engine.audit",
    "AuditReport": "corps.engine.audit",
    "AuditRow": "corps.engine.audit",
}
__all__ = [
    "AUDIT_POSITIONS",
    "DECISION_REPAIR",
    "JSON_LAYOUT",
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
    "DecodeArgs",
    "DecodeRequest",
    "Engine",
    "EngineBusy",
    "EngineClosed",
    "EngineConfig",
    "EngineStats",
    "FetchError",
    "InvalidConstraint",
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
]

if TYPE_CHECKING:
    from corps.engine.api.access import AccessEvent, AuditEvent
    from corps.engine.api.engine import Engine
    from corps.engine.api.pending import Pending
    from corps.engine.api.select import Selection
    from corps.engine.api.stream import TextStream
    from corps.engine.audit import AUDIT_POSITIONS, AuditKey, AuditReport, AuditRow
    from corps.engine.config import BadConfig, EngineConfig
    from corps.engine.errors import (
        AwaitingInput,
        CallCancelled,
        ConstraintViolated,
        EngineBusy,
        EngineClosed,
        FetchError,
        InvalidConstraint,
        ModelNotFound,
        NonFiniteLogits,
        UnsupportedModel,
    )
    from corps.engine.repair import DECISION_REPAIR, Repair
    from corps.engine.request.chat_format import ChatFormat
    from corps.engine.request.constraint import JSON_LAYOUT
    from corps.engine.request.requests import DecodeArgs, DecodeRequest, PrefillArgs, PrefillRequest
    from corps.engine.request.sampling_params import SamplingParams
    from corps.engine.stats import EngineStats


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'corps.engine' has no attribute {name!r}")
    value = getattr(import_module(_HOME[name]), name)
    globals()[name] = value
    return value
