"""What `corps run` runs: a built-in pattern, a scenario file (TOML) or a Python file.

Every problem with the input is a `ScenarioError` (the CLI exits with code 2),
naming the field or file and what was expected.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from corps.cache.errors import InvalidRequest
from corps.engine.config import Mode
from corps.patterns import registry
from corps.patterns.evaluation.scoring import without_references
from corps.patterns.scripts import BadScript, load_script, script_params_model


class ScenarioError(InvalidRequest):
    """Bad input to `corps run`: unknown pattern or parameter, wrong type, bad file."""


class Scenario(BaseModel):
    """A scenario file: which pattern (a built-in's name, or a `.py` workflow file
    relative to the scenario's folder), on which model and mode, with what inputs.

    ```toml
    pattern = "tree_of_thoughts"
    model = "smollm2-135m"        # optional
    mode = "choreographed"        # optional
    [params]
    branches = 4
    [inputs]
    question = "..."
    ```
    """

    model_config = ConfigDict(extra="forbid")
    pattern: str
    model: str | None = None
    mode: Mode | None = None
    params: dict[str, Any] = {}
    inputs: dict[str, Any] = {}


@dataclass
class Target:
    """A resolved `corps run` target: call `fn(rt, **params)`."""

    label: str
    fn: Callable[..., Awaitable[Any]]
    params: dict[str, Any]
    model: str | None = None
    mode: str | None = None
    builtin: bool = True
    sections: dict[str, str] = field(default_factory=dict)  # param -> "params." / "inputs."

    def validated(self, params: Mapping[str, Any], where: str = "") -> dict[str, Any]:
        """`params` validated against the pattern's signature and type hints (a Python
        file's `run` too: `script_params_model`), before any model loads. An input
        line's references for scoring ("answer", "id": `corps eval`) that the
        workflow does not take are left out."""
        if self.builtin:
            model = registry.params_model(self.fn)
        else:
            model = script_params_model(self.fn)
        if model.model_config.get("extra") == "forbid":
            params = without_references(params, model.model_fields)
        try:
            return dict(model.model_validate(dict(params)))
        except ValidationError as exc:
            msgs = []
            for e in exc.errors():
                name = str(e["loc"][0]) if e["loc"] else ""
                prefix = where + self.sections.get(name, "")
                rest = ".".join(str(x) for x in e["loc"])
                if e["type"] == "extra_forbidden":
                    valid = ", ".join(model.model_fields)
                    msgs.append(f"unknown parameter {prefix}{rest!r} (valid: {valid})")
                else:
                    msgs.append(f"{prefix}{rest}: {e['msg']} (got {e.get('input')!r})")
            raise ScenarioError(f"{self.label}: " + "; ".join(msgs)) from None


def parse_sets(pairs: list[str]) -> dict[str, Any]:
    """`key=value` pairs; a value is read as JSON when it parses (16, 0.5, true, [..]),
    else kept as text."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise ScenarioError(f"--set expects key=value, got {pair!r}")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        out[key.strip().replace("-", "_")] = value
    return out


def resolve(name_or_file: str) -> Target:
    path = Path(name_or_file)
    if path.suffix == ".toml":
        return _scenario(path)
    if path.suffix == ".py":
        return _python(path)
    try:
        fn = registry.get(name_or_file)
    except registry.UnknownPattern as exc:
        raise ScenarioError(f"{exc} (or give a .toml scenario or a .py file)") from None
    return Target(fn.__name__, fn, {})


def _scenario(path: Path) -> Target:
    if not path.is_file():
        raise ScenarioError(f"no scenario file {str(path)!r}")
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ScenarioError(f"{path}: not valid TOML: {exc}") from None
    try:
        sc = Scenario.model_validate(data)
    except ValidationError as exc:
        msg = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ScenarioError(f"{path}: {msg}") from None
    builtin = not sc.pattern.endswith(".py")
    try:
        fn = registry.get(sc.pattern) if builtin else _python(path.parent / sc.pattern).fn
    except registry.UnknownPattern as exc:
        raise ScenarioError(f"{path}: pattern: {exc} (or a .py file beside it)") from None
    except ScenarioError as exc:
        raise ScenarioError(f"{path}: pattern: {exc}") from None
    sections = {k: "params." for k in sc.params} | {k: "inputs." for k in sc.inputs}
    target = Target(str(path), fn, {**sc.params, **sc.inputs}, sc.model, sc.mode, builtin)
    target.sections = sections
    return target


def _python(path: Path) -> Target:
    try:
        fn = load_script(path)
        script_params_model(fn)  # its hints resolve
    except BadScript as exc:
        raise ScenarioError(str(exc)) from None
    return Target(str(path), fn, {}, builtin=False)
