"""Agents: async actors that call the engine as themselves and exchange handles."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel

from corps.agents import envelope as env_mod
from corps.cache.errors import InvalidRequest
from corps.cache.handle import Handle
from corps.cache.visibility import Private, Public, Visibility

if TYPE_CHECKING:
    from corps.agents.runtime import Runtime


class Agent:
    """Subclass this and define `async def handle(self, msg)`.

    ```python
    class Solver(Agent):
        system = "You solve math problems step by step."
        async def handle(self, msg: Handle) -> Handle:
            return await self.decode(parents=[self.system_prompt, msg], max_tokens=256)
    ```

    Class settings: `system` (prefilled once at spawn, private to this agent, kept
    across restarts), `mailbox_size` (bounded), `max_concurrency` (1: one message
    at a time, FIFO), `supervision` ("restart", "stop" or "escalate") with
    `max_restarts`, and `leak_policy` (None: the engine's default; a call's own
    `leak_policy=` overrides both).

    Every handle the agent receives (messages, payload fields, replies) is bound
    to it: reading the content of a message it cannot see raises AccessDenied.
    """

    system: ClassVar[str | None] = None
    mailbox_size: ClassVar[int] = 64
    max_concurrency: ClassVar[int] = 1
    supervision: ClassVar[str] = "restart"
    max_restarts: ClassVar[int] = 3
    leak_policy: ClassVar[str | None] = None

    def __init__(self, name: str, runtime: Runtime, system_prompt: Handle | None) -> None:
        self.name = name
        self.runtime = runtime
        self.system_prompt = system_prompt

    async def handle(self, msg: Handle | BaseModel) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define async handle(msg)")

    # ---- the engine, as this agent ----

    @property
    def engine(self):
        return self.runtime.engine

    def _as_me(self, kw: dict[str, Any], visibility: Visibility | None, policy: str | None):
        owner = kw.pop("owner", self.name)
        if owner != self.name:
            raise InvalidRequest(
                f"{self.name} cannot make a call owned by {owner!r}: an agent's calls are its own"
            )
        kw.update(owner=self.name, visibility=visibility or Public())
        kw["leak_policy"] = policy or self.leak_policy  # None: the engine's default
        return kw

    async def prefill(
        self,
        message: str | list[int],
        *,
        visibility: Visibility | None = None,
        leak_policy: str | None = None,
        **kw: Any,
    ) -> Handle:
        """Encode a message owned by this agent (public unless `visibility` says otherwise).

        `leak_policy` overrides the class's, which overrides the engine's default.
        """
        return await self.engine.prefill(message, **self._as_me(kw, visibility, leak_policy))

    async def decode(
        self, *, visibility: Visibility | None = None, leak_policy: str | None = None, **kw: Any
    ) -> Handle:
        """Generate a message owned by this agent. Inside `ask_stream`, its text streams out."""
        kw = self._as_me(kw, visibility, leak_policy)
        envelope = env_mod.current.get()
        if envelope is None or envelope.deltas is None:
            return await self.engine.decode(**kw)
        stream = self.engine.stream(**kw)
        async for delta in stream:
            envelope.deltas.send_nowait(delta)
        return stream.handle

    async def decode_many(
        self, requests: list[dict[str, Any]], *, visibility: Visibility | None = None
    ) -> list[Handle]:
        """Several decodes owned by this agent, fused into shared steps; all or nothing."""
        reqs = []
        for r in requests:
            r = dict(r)
            vis, policy = r.pop("visibility", visibility), r.pop("leak_policy", None)
            reqs.append(self._as_me(r, vis, policy))
        return await self.engine.decode_many(reqs)

    async def think(self, **kw: Any) -> Handle:
        """decode() with Private visibility: a thought only this agent can read."""
        return await self.decode(visibility=Private(), **kw)

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

    async def send(self, to: str, msg: Handle | BaseModel) -> None:
        await self.runtime.send(to, msg, sender=self.name)

    async def publish(self, topic: str, msg: Handle | BaseModel) -> None:
        await self.runtime.publish(topic, msg, sender=self.name)
