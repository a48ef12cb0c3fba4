"""corps.cache: the KV store, messages and handles, RoPE repositioning, the radix cache,
visibility and provenance."""

from corps.cache.errors import (
    BrokenInvariant,
    CacheFullError,
    CorpsError,
    ForeignHandle,
    InvalidRequest,
    PositionError,
    StoreTooSmall,
    UnknownHandle,
    ViewsFull,
)
from corps.cache.handle import Handle
from corps.cache.messages import CallFigures
from corps.cache.visibility import (
    AccessDenied,
    Leak,
    LeakageError,
    LeakWarning,
    Private,
    Public,
    Shared,
)

__all__ = [
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
]
