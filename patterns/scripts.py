"""Workflows defined in Python files: `async def run(rt, **params)` in a `.py` file.

`corps run FILE.py` loads one here, and so does each engine worker of a cluster
(`corps.patterns.cluster.runner`), which is given the file's path rather than the function:
a function travels badly between processes, a path to the same file does not.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, create_model

from corps.cache.errors import InvalidRequest
from corps.patterns import registry


class BadScript(InvalidRequest):
    """A workflow file that is missing, fails to import or defines no `async def run`."""


def load_script(path: str | Path) -> Callable[..., Awaitable[Any]]:
    """The `run` coroutine function of the Python file at `path`."""
    path = Path(path)
    if not path.is_file():
        raise BadScript(f"no Python file {str(path)!r}")
    name = f"corps_user_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pydantic payloads resolve their annotations through it
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise BadScript(f"{path}: failed to import: {exc!r}") from None
    fn = getattr(module, "run", None)
    if fn is None or not inspect.iscoroutinefunction(fn):
        raise BadScript(f"{path} defines no `async def run(rt, **params)`")
    return fn


def script_params_model(fn: Callable[..., Any]) -> type[BaseModel]:
    """A pydantic model of a workflow file's `run` parameters after the runtime, checked
    as a built-in pattern's are: each by its type hint (none: any value), defaults
    kept; unknown keys refused unless `run` takes `**params`. A hint that does not
    resolve is a `BadScript`."""
    try:
        sig = inspect.signature(fn, eval_str=True)
    except Exception as exc:  # a hint naming what the file does not define
        raise BadScript(f"{fn.__code__.co_filename}: run's type hints: {exc!r}") from None
    fields: dict[str, Any] = {}
    extra = "forbid"
    for p in list(sig.parameters.values())[1:]:
        if p.kind is p.VAR_KEYWORD:
            extra = "allow"
            continue
        if p.kind is p.VAR_POSITIONAL:
            continue
        hint = Any if p.annotation is p.empty else p.annotation
        fields[p.name] = (hint, ... if p.default is p.empty else p.default)
    config = ConfigDict(extra=extra, arbitrary_types_allowed=True)
    return create_model(f"{fn.__name__}_params", __config__=config, **fields)


def load_workflow(name_or_file: str) -> Callable[..., Awaitable[Any]]:
    """A built-in pattern by name, or the `run` of a `.py` file."""
    if name_or_file.endswith(".py"):
        return load_script(name_or_file)
    return registry.get(name_or_file)
