"""corps.engine: model loading, our forward over HF weights, sampling, and the public Engine.

Names are imported on first use, so `corps.engine.trace.events` (and the trace viewer)
and `corps.engine.config` load without torch. Handles, visibilities and the
base errors (`CorpsError`, `InvalidRequest`) are `corps.cache`'s.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

_HOME = {
    "AuditEvent": "corps.engine.api.access",
    "BadConfig": "corps.engine.config",
    "EngineConfig": "corps.engine.config",
    "Engine": "corps.engine.api.engine",
    "Pending": "corps.engine.api.pending",
    "TextStream": "corps.engine.api.stream",
    "CallCancelled": "corps.engine.errors",
    "ConstraintViolated": "corps.engine.errors",
    "InvalidConstraint": "corps.engine.errors",
    "Selection": "corps.engine.api.select",
    "ChatFormat": "corps.engine.request.chat",
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
    "AUDIT_POSITIONS": "corps.engine.audit",
    "AuditKey": "corps.engine.audit",
    "AuditReport": "corps.engine.audit",
    "AuditRow": "corps.engine.audit",
}
__all__ = [
    "AUDIT_POSITIONS",
    "DECISION_REPAIR",
    "AuditEvent",
    "AuditKey",
    "AuditReport",
    "AuditRow",
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
    from corps.engine.api.access import AuditEvent
    from corps.engine.api.engine import Engine
    from corps.engine.api.pending import Pending
    from corps.engine.api.select import Selection
    from corps.engine.api.stream import TextStream
    from corps.engine.audit import AUDIT_POSITIONS, AuditKey, AuditReport, AuditRow
    from corps.engine.config import BadConfig, EngineConfig
    from corps.engine.errors import (
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
    from corps.engine.request.chat import ChatFormat
    from corps.engine.request.requests import DecodeArgs, DecodeRequest, PrefillArgs, PrefillRequest
    from corps.engine.request.sampling_params import SamplingParams
    from corps.engine.stats import EngineStats

#: Names corps's own command line and benchmarks use from inside the engine, public
#: here so that `corps.cli` imports nothing below `corps.engine` (tests/test_layers.py):
#: name -> (module, attribute there; a submodule when the module has no such attribute).
_TOOLS: dict[str, tuple[str, str]] = {
    "CallEnd": ("corps.engine.trace.events", "CallEnd"),
    "CallQueued": ("corps.engine.trace.events", "CallQueued"),
    "CallRec": ("corps.engine.trace.reader", "CallRec"),
    "DEFAULT_MODEL": ("corps.engine.config", "DEFAULT_MODEL"),
    "DUMMY_PREFIX": ("corps.engine.model.dummy", "PREFIX"),
    "DUMMY_SHAPES": ("corps.engine.model.dummy", "SHAPES"),
    "DecodePlan": ("corps.engine.attention", "DecodePlan"),
    "EMBEDDED_MODELS": ("corps.engine.model.names", "EMBEDDED"),
    "JSON_LAYOUT": ("corps.engine.request.constraint", "JSON_LAYOUT"),
    "Names": ("corps.engine.trace.reader", "Names"),
    "POLICIES": ("corps.engine.sched.policies", "POLICIES"),
    "PrefillMask": ("corps.engine.kernels.flex_prefill", "PrefillMask"),
    "SdpaAttention": ("corps.engine.attention", "SdpaAttention"),
    "Stage": ("corps.engine.trace.events", "Stage"),
    "Step": ("corps.engine.trace.events", "Step"),
    "StepCost": ("corps.engine.sched.cost", "StepCost"),
    "StepProjection": ("corps.engine.model.decode_module", "StepProjection"),
    "Token": ("corps.engine.trace.events", "Token"),
    "Trace": ("corps.engine.trace.reader", "Trace"),
    "TraceError": ("corps.engine.trace.reader", "TraceError"),
    "cached_models": ("corps.engine.model.names", "cached_models"),
    "counting_ops": ("corps.engine.exec.counting", "counting_ops"),
    "check_adapter_of": ("corps.engine.model.adapter_files", "check_adapter_of"),
    "check_available": ("corps.engine.trace.exporter", "check_available"),
    "corps_home": ("corps.engine.model.names", "corps_home"),
    "decode_attention": ("corps.engine.kernels.decode_attention", "decode_attention"),
    "dummy_config": ("corps.engine.model.dummy", "dummy_config"),
    "flex_prefill": ("corps.engine.kernels.flex_prefill", "flex_prefill"),
    "frozen_compile_config": ("corps.engine.model.decode_module", "frozen_compile_config"),
    "gather_rotate": ("corps.engine.kernels.gather_rotate", "gather_rotate"),
    "gather_rotate_ref": ("corps.engine.kernels.gather_rotate", "gather_rotate_ref"),
    "gguf_file": ("corps.engine.model.names", "gguf_file"),
    "interpreting": ("corps.engine.kernels", "interpreting"),
    "load_hf": ("corps.engine.model.weights", "load_hf"),
    "load_weights": ("corps.engine.model.weights", "load_weights"),
    "names_of": ("corps.engine.trace.reader", "names_of"),
    "otlp": ("corps.engine.trace.spans", "otlp"),
    "read_scope": ("corps.engine.model.adapter_files", "read_scope"),
    "read_spec": ("corps.engine.model.weights", "read_spec"),
    "resolve_model": ("corps.engine.model.names", "resolve_model"),
    "torch_dtype": ("corps.engine.model.weights", "torch_dtype"),
    "trace_exporter": ("corps.engine.trace", "exporter"),
    "triton_available": ("corps.engine.kernels", "triton_available"),
    "tuning": ("corps.engine.model", "tuning"),
    "weight_format": ("corps.engine.model.tuning", "weight_format"),
}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        value = getattr(import_module(_HOME[name]), name)
    elif name in _TOOLS:
        home, attr = _TOOLS[name]
        module = import_module(home)
        value = getattr(module, attr) if hasattr(module, attr) else import_module(f"{home}.{attr}")
    else:
        raise AttributeError(f"module 'corps.engine' has no attribute {name!r}")
    globals()[name] = value
    return value
