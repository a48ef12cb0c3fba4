"""corps.cache: the KV store, messages and handles, RoPE repositioning, the radix cache."""

from corps.cache.errors import (
    CacheFullError,
    CorpsError,
    InvalidRequest,
    PositionError,
    UnknownHandle,
)
from corps.cache.handle import Handle

__all__ = [
    "CacheFullError",
    "CorpsError",
    "Handle",
    "InvalidRequest",
    "PositionError",
    "UnknownHandle",
]
