"""Settings whose defaults come from the environment, read here and nowhere else:
`CORPS_CONTEXTS` (contexts), `CORPS_ATTENTION` (attention backend) and
`CORPS_PRECOMPILED` (the precompiled decode step); `EngineConfig` names which."""

from __future__ import annotations

import os

from corps.engine.errors import BadConfig


def env_value(name: str, allowed: tuple[str, ...]) -> str | None:
    """The environment variable `name` if set (case and spaces aside), else None; a value
    not `allowed` is an InvalidRequest naming the variable and what it takes."""
    value = os.environ.get(name, "").strip().lower()
    if value and value not in allowed:
        raise BadConfig(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
    return value or None


def env_setting(name: str, allowed: tuple[str, ...], default: str, field: str) -> str:
    """Setting `field`'s default: $`name` if set, else `default`; a value not `allowed`
    is a BadConfig that names the variable and says to set or unset it."""
    value = (os.environ.get(name) or default).strip().lower()
    if value not in allowed:
        raise BadConfig(
            f"{name}={value!r} is not a setting of {field}: set it to "
            f"{', '.join(allowed)}, or unset it",
            (field,),
        )
    return value
