"""corps.engine: model loading, our forward over HF weights, sampling, and the public Engine.

Names are imported on first use, so `corps.engine.trace` (and the trace viewer)
load without torch.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

_HOME = {
    "Handle": "corps.cache.handle",
    "LeakWarning": "corps.cache.visibility",
    "Engine": "corps.engine.engine",
    "Pending": "corps.engine.engine",
    "TextStream": "corps.engine.engine",
    "CallCancelled": "corps.engine.errors",
    "CorpsError": "corps.engine.errors",
    "EngineBusy": "corps.engine.errors",
    "EngineClosed": "corps.engine.errors",
    "FetchError": "corps.engine.errors",
    "InvalidRequest": "corps.engine.errors",
    "ModelNotFound": "corps.engine.errors",
    "NonFiniteLogits": "corps.engine.errors",
    "UnsupportedModel": "corps.engine.errors",
    "SamplingParams": "corps.engine.sampling",
    "EngineStats": "corps.engine.stats",
}
__all__ = [
    "CallCancelled",
    "CorpsError",
    "Engine",
    "EngineBusy",
    "EngineClosed",
    "EngineStats",
    "FetchError",
    "Handle",
    "InvalidRequest",
    "LeakWarning",
    "ModelNotFound",
    "NonFiniteLogits",
    "Pending",
    "SamplingParams",
    "TextStream",
    "UnsupportedModel",
]

if TYPE_CHECKING:
    from corps.cache.handle import Handle
    from corps.cache.visibility import LeakWarning
    from corps.engine.engine import Engine, Pending, TextStream
    from corps.engine.errors import (
        CallCancelled,
        CorpsError,
        EngineBusy,
        EngineClosed,
        FetchError,
        InvalidRequest,
        ModelNotFound,
        NonFiniteLogits,
        UnsupportedModel,
    )
    from corps.engine.sampling import SamplingParams
    from corps.engine.stats import EngineStats


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'corps.engine' has no attribute {name!r}")
    value = getattr(import_module(_HOME[name]), name)
    globals()[name] = value
    return value
