"""Tools for agents: typed Python functions an agent offers its model.

`Agent.tools` (or `decode_with_tools(tools=...)`) lists plain functions, sync or
async, whose parameters are annotated; each becomes a `Tool` whose parameter
schema pydantic derives from the signature and whose description is the
docstring's first paragraph. A decode that offers tools is constrained by the
same grammar `corps serve` uses (`corps.engine.request.tools`): the reply is
either text or well-formed calls of offered tools, their arguments valid JSON of
each tool's schema. `run_call` validates the arguments and runs the function;
what it returns (JSON unless a string) or raises (its type and message) becomes
the text of the tool's result message, so a tool's exception reaches the model as
an error it can read, never as a crash of the agent.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from corps.cache.errors import InvalidRequest
from corps.engine.request.tools import Call

#: A tool result's text is cut to this many characters (a model reads it back).
MAX_RESULT_CHARS = 4000


@dataclass(frozen=True)
class Tool:
    """A function offered to a model: its name, description and parameter schema."""

    name: str
    description: str
    params: type[BaseModel]  # the arguments' model, from the signature
    fn: Callable[..., Any]

    @property
    def parameters(self) -> dict:
        return self.params.model_json_schema()

    @classmethod
    def of(cls, fn: Callable[..., Any] | Tool) -> Tool:
        """The tool of a function (every parameter annotated, none positional-only
        or variadic); a Tool as it is."""
        if isinstance(fn, Tool):
            return fn
        if not callable(fn) or not hasattr(fn, "__name__"):
            raise InvalidRequest(f"a tool is a function, got {type(fn).__name__}")
        fields: dict[str, Any] = {}
        for p in inspect.signature(fn).parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
                raise InvalidRequest(f"tool {fn.__name__}: parameter {p.name!r} cannot be named")
            if p.annotation is inspect.Parameter.empty:
                raise InvalidRequest(f"tool {fn.__name__}: annotate parameter {p.name!r}")
            default = ... if p.default is inspect.Parameter.empty else p.default
            fields[p.name] = (p.annotation, default)
        hints = _hints(fn)
        fields = {k: (hints.get(k, t), d) for k, (t, d) in fields.items()}
        # extra="forbid": the schema says additionalProperties false, so a constrained
        # call ends once its arguments are given
        params = create_model(
            f"{fn.__name__}_args", __config__=ConfigDict(extra="forbid"), **fields
        )
        doc = (inspect.getdoc(fn) or "").split("\n\n")[0].replace("\n", " ")
        return cls(fn.__name__, doc, params, fn)


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    import typing

    try:
        return typing.get_type_hints(fn, include_extras=True)
    except Exception:  # a hint that names what is not importable: as written
        return {}


async def run_call(tools: dict[str, Tool], call: Call) -> tuple[str, bool]:
    """Run one call: (the result's text, whether it succeeded). An unknown tool,
    arguments that do not validate, or the function's own exception give an
    error text, never a raise (cancellation still propagates)."""
    tool = tools.get(call.name or "")
    if tool is None:
        return f"error: no tool named {call.name!r}", False
    try:
        args = tool.params.model_validate_json(call.arguments or "{}")
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "arguments"
        return f"error: {tool.name} {where}: {first['msg']}", False
    try:
        result = tool.fn(**{k: getattr(args, k) for k in type(args).model_fields})
        if inspect.isawaitable(result):
            result = await result
    except Exception as exc:  # the model reads it and may try again
        return f"error: {type(exc).__name__}: {exc}"[:MAX_RESULT_CHARS], False
    text = result if isinstance(result, str) else json.dumps(result, default=str)
    return text[:MAX_RESULT_CHARS], True
