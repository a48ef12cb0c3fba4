"""corps.cache: the global KV store, messages and handles, RoPE repositioning, radix prefix cache."""

from corps.cache.errors import CacheFullError, CorpsError, InvalidRequest, PositionError, UnknownHandle
from corps.cache.handle import Handle

__all__ = ["CacheFullError", "CorpsError", "Handle", "InvalidRequest", "PositionError", "UnknownHandle"]
