"""corps.engine: model loading, our forward over HF weights, sampling, and the public Engine."""

from corps.cache.handle import Handle
from corps.engine.engine import Engine, TextStream
from corps.engine.errors import (
    CorpsError,
    FetchError,
    InvalidRequest,
    ModelNotFound,
    UnsupportedModel,
)
from corps.engine.sampling import SamplingParams
from corps.engine.stats import EngineStats

__all__ = [
    "CorpsError",
    "Engine",
    "EngineStats",
    "FetchError",
    "Handle",
    "InvalidRequest",
    "ModelNotFound",
    "SamplingParams",
    "TextStream",
    "UnsupportedModel",
]
