"""Agents: async actors that call the engine as themselves and exchange handles."""

from __future__ import annotations

import dataclasses
import re
import types
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, Unpack

from pydantic import BaseModel

from corps.agents import envelope as env_mod
from corps.agents.errors import IncompleteReply
from corps.cache.errors import InvalidRequest
from corps.cache.handle import Handle
from corps.cache.visibility import Private, Public, Visibility

if TYPE_CHECKING:  # the engine's argument types (corps.agents imports no torch)
    from corps.engine.api.select import Selection
    from corps.engine.request.requests import DecodeArgs, PrefillArgs, Text


#: The most rounds of tool calls one `decode_with_tools` may run.
MAX_TOOL_ROUNDS = 32

_NOT_SETTINGS = (types.FunctionType, property, classmethod, staticmethod)


def setting_hints(cls: type) -> dict[str, Any]:
    """An agent class's settings: every public class attribute that is not a method,
    by name, with its type (its hint, else its default's type; None: any)."""
    import typing

    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # a hint that names what is not importable here: checked by default
        hints = {}
    out: dict[str, Any] = {}
    for klass in reversed(cls.__mro__[: cls.__mro__.index(Agent) + 1]):
        for key, value in vars(klass).items():
            if (
                key.startswith("_")
                or callable(value)
                or isinstance(value, (property, classmethod, staticmethod))
            ):
                continue
            hint = hints.get(key)
            if typing.get_origin(hint) is ClassVar:
                (hint,) = typing.get_args(hint) or (None,)
            out[key] = hint if hint is not None else (None if value is None else type(value))
    return out


def _checked(cls: type, key: str, hint: Any, value: Any) -> Any:
    from pydantic import TypeAdapter, ValidationError

    if hint is None:
        return value
    try:
        return TypeAdapter(hint).validate_python(value, strict=True)
    except ValidationError as exc:
        first = exc.errors()[0]["msg"]
        raise InvalidRequest(f"{cls.__name__}.{key}: {first} (got {value!r:.60})") from None
    except Exception:  # a hint pydantic cannot check: taken as given
        return value


class Host(Protocol):
    """What an agent uses of the runtime it lives in (`corps.agents.runtime.Runtime`,
    or any `AgentRuntime`): its engine, and asking, sending and publishing."""

    engine: Any

    async def ask(self, to: str, msg: Any, **kw: Any) -> Any: ...

    async def send(self, to: str, msg: Any, *, sender: str | None = None) -> None: ...

    async def publish(self, topic: str, msg: Any, *, sender: str | None = None) -> None: ...


class Agent:
    """Subclass this and define `async def handle(self, msg)`.

    ```python
    class Solver(Agent):
        system = "You solve math problems step by step."
        async def handle(self, msg: Handle) -> Handle:
            return await self.decode(parents=[self.system_prompt, msg], max_tokens=256)
    ```

    Class settings: `system` (prefilled once at spawn, kept across restarts; private
    to this agent unless `system_visibility` is "public": then other agents'
    calls may read encodings built over it without a leak), `mailbox_size`
    (bounded), `max_concurrency` (1: one message at a time, FIFO), `supervision`
    ("restart", "stop" or "escalate") with
    `max_restarts`, `leak_policy` (None: the engine's default; a call's own
    `leak_policy=` overrides both), `objective` ("latency" or "throughput" for
    the engine's scheduling policy; None: the workflow's; a call's own overrides)
    and `repair` (a repair policy such as "recompute:0.15" for its calls whose
    context is rewired, `corps.engine.repair`; None: the workflow's, else the
    engine's; a call's own overrides; "auto" lets the engine choose it from audits)
    and `audit` (N: 1 in N of its decodes audited against the baseline, 0: none,
    `corps.engine.audit`; None: the workflow's, else the engine's).

    Every handle the agent receives (messages, payload fields, replies) is bound
    to it: reading the content of a message it cannot see raises AccessDenied.
    """

    system: ClassVar[str | None] = None
    system_visibility: ClassVar[Literal["private", "public"]] = "private"
    mailbox_size: ClassVar[int] = 64
    max_concurrency: ClassVar[int] = 1
    supervision: ClassVar[str] = "restart"
    max_restarts: ClassVar[int] = 3
    leak_policy: ClassVar[str | None] = None
    objective: ClassVar[str | None] = None
    repair: ClassVar[str | None] = None
    audit: ClassVar[int | None] = None
    tools: ClassVar[tuple[Callable[..., Any], ...]] = ()
    max_tool_rounds: ClassVar[int] = 4

    @classmethod
    def configured(cls, **settings: Any) -> type[Agent]:
        """This class with some of its settings replaced: `system`, `supervision`,
        `repair`, ... or any class attribute a subclass declares that is not a
        method (`max_tokens = 64`). What `Runtime.spawn(cls, name, **settings)`
        starts, so one class serves agents of different settings. Each value is
        checked against the attribute's type hint (an unannotated one's against its
        default's type); an unknown name or a wrong value is an InvalidRequest that
        lists the settings."""
        if not settings:
            return cls
        hints = setting_hints(cls)
        checked = {}
        for key, value in settings.items():
            if key not in hints:
                raise InvalidRequest(
                    f"{cls.__name__} has no setting {key!r} (its settings: "
                    f"{', '.join(sorted(hints))})"
                )
            checked[key] = _checked(cls, key, hints[key], value)
        return type(cls.__name__, (cls,), {"__module__": cls.__module__, **checked})

    def __init__(self, name: str, runtime: Host, system_prompt: Handle | None) -> None:
        self.name = name
        self.runtime = runtime
        self.system_prompt = system_prompt

    async def handle(self, msg: Handle | BaseModel) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define async handle(msg)")

    # ---- the engine, as this agent ----

    @property
    def engine(self):
        return self.runtime.engine

    def _as_me(self, args: Mapping[str, Any], visibility: Visibility | None = None) -> dict:
        """The call's arguments made as this agent: owned by it, public unless said
        otherwise, under its leak policy unless the call names one."""
        kw = dict(args)
        owner = kw.pop("owner", self.name)
        if owner != self.name:
            raise InvalidRequest(
                f"{self.name} cannot make a call owned by {owner!r}: an agent's calls are its own"
            )
        kw.update(owner=self.name, visibility=kw.get("visibility") or visibility or Public())
        kw["leak_policy"] = kw.get("leak_policy") or self.leak_policy  # None: the engine's
        if kw.get("objective") is None and self.objective is not None:
            kw["objective"] = self.objective  # else the workflow's
        if kw.get("repair") is None and self.repair is not None:
            kw["repair"] = self.repair  # else the workflow's, else the engine's
        return kw

    async def prefill(self, message: Text, **args: Unpack[PrefillArgs]) -> Handle:
        """Encode a message owned by this agent (public unless `visibility` says otherwise).

        `leak_policy` overrides the class's, which overrides the engine's default.
        """
        return await self.engine.prefill(message, **self._as_me(args))

    async def decode(
        self, *, schema: type[BaseModel] | None = None, **args: Unpack[DecodeArgs]
    ) -> Handle:
        """Generate a message owned by this agent. Inside `ask_stream`, its text streams out.

        `schema` (a pydantic model class) constrains the reply to the model's JSON
        schema and puts the parsed object on the handle (`handle.value`), so agents
        exchange typed payloads without parsing text."""
        if schema is not None:
            if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
                raise InvalidRequest(f"schema must be a pydantic model class, got {schema!r}")
            args = {**args, "json_schema": schema}
        kw = self._decoding(self._as_me(args))
        envelope = env_mod.current.get()
        if envelope is None or envelope.deltas is None:
            handle = await self.engine.decode(**kw)
        else:
            stream = self.engine.stream(**kw)
            async for delta in stream:
                envelope.deltas.send_nowait(delta)
            handle = stream.handle
        if schema is not None and handle.value is None:
            warnings.warn(incomplete(self.name, schema, handle), IncompleteReply, stacklevel=2)
        return handle

    async def decode_with_tools(
        self,
        *,
        parents: Sequence[Handle],
        tools: Sequence[Callable[..., Any]] | None = None,
        max_rounds: int | None = None,
        tool_choice: str = "auto",
        parallel: bool = False,
        **args: Any,
    ) -> Handle:
        """Decode offering tools (`tools`, else the class's `tools`): a reply that calls
        some runs them (`corps.agents.tools`), each result a "tool" message of this
        agent, and the model goes on over its call and their results; the first reply
        that calls nothing is returned (or the last, after `max_rounds` rounds of
        calls, else the class's `max_tool_rounds`). The reply is constrained to text
        or well-formed calls of the offered tools; a tool's exception reaches the
        model as an error result. Each round reuses the encodings of the rounds
        before it (its call and results are parents), in both modes. `tool_choice`
        binds the first reply: "auto" (text or calls), "required" (calls), or a
        tool's name (a call of it); later replies are "auto". `parallel`: a reply
        may hold several calls, one per line (run in order). Other arguments are
        `decode`'s, bar the constraints."""
        from corps.agents.tools import Tool, run_call
        from corps.engine.request.tools import Offer, syntax_of

        offered = [Tool.of(t) for t in (type(self).tools if tools is None else tools)]
        if not offered:
            return await self.decode(parents=list(parents), **args)
        taken = {"schema", "json_schema", "grammar", "regex", "choices"} & args.keys()
        if taken:
            raise InvalidRequest(
                f"decode_with_tools constrains its replies to text or calls: drop {sorted(taken)}"
            )
        rounds = self.max_tool_rounds if max_rounds is None else max_rounds
        if not 0 <= rounds <= MAX_TOOL_ROUNDS:
            raise InvalidRequest(f"max_rounds must be 0 to {MAX_TOOL_ROUNDS}, got {rounds}")
        by_name = {t.name: t for t in offered}
        if tool_choice not in ("auto", "required", *by_name):
            raise InvalidRequest(
                f"tool_choice must be auto, required or a tool's name ({', '.join(by_name)}), "
                f"got {tool_choice!r:.60}"
            )
        syntax = syntax_of(getattr(self.engine.tokenizer, "chat_template", None))
        specs = tuple((t.name, t.description, t.parameters) for t in offered)
        offer = Offer(syntax, specs, "auto", parallel=parallel)
        guide = await self._tool_guide(offer)
        context = [guide, *parents]
        first = dataclasses.replace(offer, choice=tool_choice)
        done = 0
        while True:
            grammar = (first if done == 0 else offer).grammar()
            reply = await self.decode(parents=context, grammar=grammar, **args)
            _, calls = offer.parse(reply.text)
            if not calls or done == rounds or not all(c.complete for c in calls):
                return reply
            results = []
            for call in calls:
                text, ok = await run_call(by_name, call)
                self._trace_tool(call.name or "", ok, text if not ok else "")
                results.append(await self.prefill(text, role="tool"))
            context = [*context, reply, *results]
            done += 1

    async def _tool_guide(self, offer) -> Handle:
        """The system message that lists the offered tools, encoded once per agent and
        set of tools (public: it holds nothing secret, so reading it leaks nothing)."""
        guides = self.__dict__.setdefault("_tool_guides", {})
        text = offer.instructions()
        guide = guides.get(text)
        if guide is None or guide.freed:
            guide = guides[text] = await self.prefill(text, role="system", visibility=Public())
        return guide

    def _trace_tool(self, name: str, ok: bool, error: str) -> None:
        rec = getattr(self.engine, "recorder", None)
        if rec is not None and rec.on:
            from corps.engine.trace.events import ActorEvent

            detail = name if ok else f"{name}: {error.split(':', 2)[1].strip()}"[:120]
            rec.emit(ActorEvent(t=rec.now(), event="tool", agent=self.name, detail=detail, ok=ok))

    async def decode_many(
        self, requests: list[Mapping[str, Any]], *, visibility: Visibility | None = None
    ) -> list[Handle]:
        """Several decodes (`DecodeArgs` each) owned by this agent, fused into shared
        steps; all or nothing. `visibility` applies to those that give none."""
        kw = [self._decoding(self._as_me(r, visibility)) for r in requests]
        return await self.engine.decode_many(kw)

    def _decoding(self, kw: dict) -> dict:
        """A decode's arguments with this agent's audit rate unless the call names one."""
        if kw.get("audit") is None and self.audit is not None:
            kw["audit"] = self.audit  # else the workflow's, else the engine's
        return kw

    async def select(self, *, options: Sequence[str], **args: Any) -> Selection:
        """`Engine.select` as this agent: score `options` after `parents`, keep the best
        (its message is owned by this agent)."""
        return await self.engine.select(options=options, **self._as_me(args))

    async def think(self, **args: Unpack[DecodeArgs]) -> Handle:
        """decode() with Private visibility: a thought only this agent can read."""
        return await self.decode(**{**args, "visibility": Private()})

    def read(self, handle: Handle) -> str:
        """The text of a message this agent may see (else AccessDenied)."""
        return self.engine.read(handle, reader=self.name)

    # ---- other agents ----

    async def ask(
        self,
        to: str,
        msg: Handle | BaseModel,
        *,
        timeout: float | None = None,
        stream: bool = False,
    ) -> Any:
        """Request/response. With stream=True the callee's text deltas flow to our asker."""
        envelope = env_mod.current.get()
        deltas = envelope.deltas if stream and envelope is not None else None
        return await self.runtime.ask(to, msg, timeout=timeout, sender=self.name, deltas=deltas)

    async def ask_many(
        self, asks: Sequence[tuple[str, Handle | BaseModel]], *, timeout: float | None = None
    ) -> list[Any]:
        """`Runtime.ask_many` as this agent: several asks at once, results in order."""
        return await self.runtime.ask_many(asks, timeout=timeout, sender=self.name)

    async def send(self, to: str, msg: Handle | BaseModel) -> None:
        await self.runtime.send(to, msg, sender=self.name)

    async def publish(self, topic: str, msg: Handle | BaseModel) -> None:
        await self.runtime.publish(topic, msg, sender=self.name)


def _cut_field(text: str, schema: type[BaseModel]) -> str | None:
    """The field a cut JSON reply was writing: its last whole key, else the one field
    of the schema its unfinished key begins."""
    keys = re.findall(r'"(\w+)"\s*:', text)
    if keys:
        return keys[-1]
    start = re.search(r'"(\w*)$', text)
    fields = [f for f in schema.model_fields if start and f.startswith(start.group(1))]
    return fields[0] if len(fields) == 1 else None


def incomplete(agent: str, schema: type[BaseModel], handle: Handle) -> str:
    """Why a typed reply has no value, in one line naming the agent, the schema, the
    field it was cut in and the token budget (no text of the reply)."""
    what = f"{agent}'s {schema.__name__} reply (message {handle.id})"
    if handle.complete:
        return f"{what} does not validate against {schema.__name__}; its value is None"
    field = _cut_field(handle.text, schema)
    field = f" inside field {field!r}" if field else ""
    return (
        f"{what} was cut at its max_tokens ({len(handle.generated)} tokens){field}; its value "
        f"is None: raise max_tokens, or bound the schema's strings (Field(max_length=...))"
    )
