"""corps.engine: model loading, our forward over HF weights, sampling, and the public Engine."""

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
    UnsupportedModel,
)
from corps.engine.sampling import SamplingParams
from corps.engine.stats import EngineStats

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
    "Pending",
    "SamplingParams",
    "TextStream",
    "UnsupportedModel",
]
