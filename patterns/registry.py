"""The built-in patterns by name, with their parameters read from their signatures.

A pattern's keyword parameters (inputs and settings alike) are its one source
of truth: `params_model` turns them into a pydantic model, so `corps run
--set`, scenario files and `--inputs` lines are validated the same way, and
`corps scenarios` lists them with their defaults.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from corps.cache.errors import InvalidRequest
from corps.patterns.branch_solve_merge import branch_solve_merge
from corps.patterns.debate import debate
from corps.patterns.map_reduce import map_reduce
from corps.patterns.multi_qa import multi_qa
from corps.patterns.parallel_debate import parallel_debate
from corps.patterns.prisoners_dilemma import prisoners_dilemma
from corps.patterns.result import PatternResult
from corps.patterns.tree_of_thoughts import tree_of_thoughts

PatternFn = Callable[..., Awaitable[PatternResult]]

PATTERNS: dict[str, PatternFn] = {
    fn.__name__: fn
    for fn in (
        debate,
        parallel_debate,
        tree_of_thoughts,
        branch_solve_merge,
        map_reduce,
        multi_qa,
        prisoners_dilemma,
    )
}


class UnknownPattern(InvalidRequest):
    """No built-in pattern of that name."""


class BadParameters(InvalidRequest):
    """Parameters a pattern does not take, or of the wrong type."""


def canonical(name: str) -> str:
    """`tree-of-thoughts` and `tree_of_thoughts` name the same pattern."""
    return name.strip().replace("-", "_").lower()


def get(name: str) -> PatternFn:
    fn = PATTERNS.get(canonical(name))
    if fn is None:
        known = ", ".join(n.replace("_", "-") for n in PATTERNS)
        raise UnknownPattern(f"no pattern named {name!r}; the built-ins are: {known}")
    return fn


def params_model(fn: Callable[..., Any]) -> type[BaseModel]:
    """A pydantic model of `fn`'s parameters after the runtime, defaults included."""
    fields: dict[str, Any] = {}
    for p in list(inspect.signature(fn, eval_str=True).parameters.values())[1:]:
        default = ... if p.default is inspect.Parameter.empty else p.default
        fields[p.name] = (p.annotation, default)
    config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
    return create_model(f"{fn.__name__}_params", __config__=config, **fields)


def validate(fn: Callable[..., Any], params: Mapping[str, Any], where: str = "") -> dict:
    """Checked and converted parameters for `fn`; BadParameters saying what is wrong."""
    model = params_model(fn)
    try:
        return dict(model.model_validate(dict(params)))
    except ValidationError as exc:
        raise BadParameters(describe_errors(exc, model, where)) from None


def describe_errors(exc: ValidationError, model: type[BaseModel], where: str = "") -> str:
    out = []
    for e in exc.errors():
        path = ".".join(str(x) for x in e["loc"])
        if e["type"] == "extra_forbidden":
            known = ", ".join(model.model_fields)
            out.append(f"{where}unknown parameter {path!r} (valid: {known})")
        else:
            out.append(f"{where}{path}: {e['msg']} (got {e.get('input')!r})")
    return "; ".join(out)


def parameters(fn: Callable[..., Any]) -> list[tuple[str, str, Any]]:
    """(name, type, default) of each parameter, for listings."""
    out = []
    for p in list(inspect.signature(fn).parameters.values())[1:]:
        ann = (
            p.annotation
            if isinstance(p.annotation, str)
            else getattr(p.annotation, "__name__", p.annotation)
        )
        out.append((p.name, str(ann), p.default))
    return out


async def run_pattern(rt, name: str, params: Mapping[str, Any]) -> PatternResult:
    """Run built-in pattern `name` with validated `params` in runtime `rt`."""
    fn = get(name)
    return await fn(rt, **validate(fn, params))
