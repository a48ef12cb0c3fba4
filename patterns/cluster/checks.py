"""What a cluster checks on the driver before any worker sees it: the workflow (a
built-in or a .py file, by absolute path), its parameters, the input ids, the config's
paths made absolute."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from corps.cache.errors import InvalidRequest
from corps.engine.config import EngineConfig
from corps.patterns import registry
from corps.patterns.evaluation.scoring import without_references


def absolute_paths(config: EngineConfig) -> dict[str, Any]:
    """A model or adapter given as a relative path here, made absolute: a worker's
    working directory is not the driver's."""
    out: dict[str, Any] = {}
    if Path(config.model).exists():
        out["model"] = str(Path(config.model).resolve())
    if config.adapter is not None:
        out["adapter"] = Path(config.adapter).resolve()
    return out


def workflow_name(workflow: str | Callable[..., Any]) -> str:
    """What a worker loads: a built-in's name, or a `.py` file's absolute path (a
    worker's working directory is not the driver's)."""
    if callable(workflow):
        if registry.PATTERNS.get(getattr(workflow, "__name__", "")) is not workflow:
            raise InvalidRequest(
                "a cluster runs a built-in pattern (by name or function) or a .py file's "
                "`run` (by path): workers load the workflow themselves"
            )
        return workflow.__name__
    if workflow.endswith(".py"):
        path = Path(workflow).resolve()
        if not path.is_file():
            raise InvalidRequest(f"no Python file {workflow!r}")
        return str(path)
    return registry.canonical(workflow)


def checked_params(workflow: str, params: dict[str, Any]) -> dict[str, Any]:
    """A built-in pattern's parameters, checked here (not on a worker) and without the
    scoring references it does not take; a file's, as given."""
    try:
        fn = registry.get(workflow)
    except registry.UnknownPattern:
        if workflow.endswith(".py"):
            return dict(params)
        raise
    return registry.validate(fn, without_references(params, registry.params_model(fn).model_fields))


def check_ids(ids: list, n: int) -> None:
    if len(ids) != n:
        raise InvalidRequest(f"{len(ids)} ids for {n} inputs")
    seen: set = set()
    for i in ids:
        if not isinstance(i, int | str) or isinstance(i, bool):
            raise InvalidRequest(f"input id {i!r}: ids are strings or integers")
        if i in seen:
            raise InvalidRequest(f"input id {i!r} appears twice: every input needs its own id")
        seen.add(i)
