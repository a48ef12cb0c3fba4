"""From an OpenAI request to engine calls, and from their handles to the response.

A chat's messages become messages of the store: each attends to the ones before
it (a chain: what the baseline's causal prompt is), and the reply attends to
all of them. `MessageCache` keeps encoded prompt messages by what they attend
to, their role and text, so a client that resends a conversation (as the plain
OpenAI API makes it do) reuses the encodings of every message it already sent,
the replies it got included; in baseline mode the radix cache does the same
for the rendered prompt. The extension lets a message name a stored message by
id instead (`corps_message_id`, optionally at an `offset`): read as it is,
never encoded again, under the engine's visibility rules.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import anyio

from corps.cache.handle import Handle
from corps.cache.visibility import Private
from corps.cli.serve.schema import ChatRequest, Message, NamedChoice, Sampling

#: finish reasons of the engine (`Handle.finish_reason`) as OpenAI's
FINISH = {"max_tokens": "length", "forced": "length"}
#: prompt messages the cache keeps encoded (least recently used freed first)
CACHE_MESSAGES = 4096
DEFAULT_MAX_TOKENS = 256


class MessageCache:
    """The messages the server made (prompt messages and replies), least recently used
    freed first, and the latest of them by (owner, visibility, the ids it attends to,
    where, role, text): what a resent message is found by."""

    def __init__(self, engine, size: int = CACHE_MESSAGES) -> None:
        self.engine, self.size = engine, size
        self._owned: OrderedDict[int, tuple[tuple, Handle]] = OrderedDict()  # by message id
        self._by_key: dict[tuple, Handle] = {}
        self._encoding: dict[tuple, anyio.Event] = {}  # keys being encoded now

    @staticmethod
    def key(
        owner: str | None, parents: list[Handle], offsets: list, role: str, text: str,
        private: bool = False,
    ) -> tuple:  # fmt: skip
        return (owner, private, tuple(h.id for h in parents), tuple(offsets), role, text)

    async def encode(
        self, role: str, text: str, parents: list[Handle], offsets: list, owner: str | None,
        private: bool = False,
    ) -> tuple[Handle, bool]:  # fmt: skip
        """The message's handle, encoded now or found; and whether it was found."""
        key = self.key(owner, parents, offsets, role, text, private)
        if key in self._encoding:  # a request beside this one is encoding it: share it
            await self._encoding[key].wait()
        found = self._by_key.get(key)
        if found is not None and not found.freed:
            self._owned.move_to_end(found.id)
            return found, True
        given = offsets if any(o is not None for o in offsets) else None
        visibility = Private() if private else None
        self._encoding[key] = done = anyio.Event()
        try:
            handle = await self.engine.prefill(
                text, role=role, parents=list(parents), offsets=given, owner=owner,
                visibility=visibility,
            )  # fmt: skip
            self.keep(key, handle)
        finally:
            del self._encoding[key]
            done.set()
        return handle, False

    def keep(self, key: tuple, handle: Handle) -> None:
        """Own `handle` (freed when it is the least recently used past `size`), and
        find it by `key` from now on."""
        self._by_key[key] = handle
        self._owned[handle.id] = (key, handle)
        self._owned.move_to_end(handle.id)
        while len(self._owned) > self.size:
            self._drop(*self._owned.popitem(last=False)[1])

    def _drop(self, key: tuple, handle: Handle) -> None:
        if self._by_key.get(key) is handle:
            del self._by_key[key]
        if not handle.freed:
            self.engine.free(handle)

    def __len__(self) -> int:
        return len(self._owned)

    def tokens(self) -> int:
        """Tokens of the live messages it owns (the store slots it holds)."""
        return sum(h.length for _, h in self._owned.values() if not h.freed)

    def clear(self) -> None:
        """Free every message it owns."""
        while self._owned:
            self._drop(*self._owned.popitem()[1])


@dataclass
class Prompt:
    """A request's messages in the store: the reply's parents and where they sit."""

    handles: list[Handle] = field(default_factory=list)
    offsets: list[int | None] = field(default_factory=list)
    cached_tokens: int = 0  # tokens of messages that were in the store before the request

    @property
    def tokens(self) -> int:
        return sum(h.length for h in self.handles)

    def settle(self, engine, reply: Handle) -> None:
        """In baseline mode the messages hold text only and the reply re-encoded their
        text: what was cached is the prefix its radix cache gave it."""
        if engine.mode == "baseline":
            self.cached_tokens = min(reply.tokens_reused, self.tokens)

    def given_offsets(self) -> list[int | None] | None:
        return self.offsets if any(o is not None for o in self.offsets) else None


async def prompt_of(engine, cache: MessageCache, req: ChatRequest) -> Prompt:
    """Each message of the request as a handle (encoded, found, or named by id)."""
    prompt, agent = Prompt(), req.corps_agent
    messages = list(req.messages)
    tools = tools_prompt(req)
    if tools is not None:
        messages.insert(0, Message(role="system", content=tools))
    for m in messages:
        if m.corps_message_id is not None:
            h = engine.handle(m.corps_message_id, reader=agent)
            offset = m.offset
            prompt.cached_tokens += h.length
        else:
            role = "system" if m.role == "developer" else m.role
            private = m.corps_visibility == "private"
            h, found = await cache.encode(
                role, m.text(), prompt.handles, prompt.offsets, agent, private
            )
            offset = None
            prompt.cached_tokens += h.length if found else 0
        prompt.handles.append(h)
        prompt.offsets.append(offset)
    return prompt


def tools_prompt(req: ChatRequest) -> str | None:
    """The system message that tells the model its tools (None: no tools offered)."""
    if not req.tools or req.tool_choice == "none":
        return None
    listed = "\n".join(
        json.dumps({"name": t.function.name, "description": t.function.description,
                    "parameters": t.function.parameters}) for t in req.tools
    )  # fmt: skip
    return (
        "You can call these tools. To call one, reply with only a JSON object "
        '{"name": <tool name>, "arguments": <its arguments>}.\n' + listed
    )


def call_schema(req: ChatRequest) -> dict | None:
    """The JSON schema a reply must match to be a tool call the request forces
    (tool_choice "required" or a named tool); None when the model may answer freely."""
    tools = req.tools or []
    choice = req.tool_choice
    if isinstance(choice, NamedChoice):
        tools = [t for t in tools if t.function.name == choice.function["name"]]
    elif choice != "required":
        return None
    shapes = [
        {"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
         "properties": {"name": {"const": t.function.name}, "arguments": t.function.parameters}}
        for t in tools
    ]  # fmt: skip
    return shapes[0] if len(shapes) == 1 else {"anyOf": shapes}


def decode_args(req: Sampling, prompt: Prompt, *, chat: bool) -> dict[str, Any]:
    """The `DecodeArgs` of one choice (without its seed)."""
    max_tokens = getattr(req, "max_completion_tokens", None) or req.max_tokens
    args: dict[str, Any] = dict(
        parents=list(prompt.handles),
        offsets=prompt.given_offsets(),
        max_tokens=max_tokens or DEFAULT_MAX_TOKENS,
        temperature=req.temperature,
        top_p=req.top_p,
        stop=tuple([req.stop] if isinstance(req.stop, str) else req.stop or ()),
        logprobs=req.logprobs,
        owner=req.corps_agent,
    )
    if not chat:  # a completion continues its prompt, unframed
        args.update(frame=False, header=completion_prompt(req))
        return args
    if req.top_logprobs:  # type: ignore[attr-defined]
        args["top_logprobs"] = req.top_logprobs  # type: ignore[attr-defined]
    schema = call_schema(req)  # type: ignore[arg-type]
    fmt = req.response_format  # type: ignore[attr-defined]
    if schema is not None:
        args["json_schema"] = schema
    elif fmt is not None and fmt.type == "json_object":
        args["json_schema"] = {"type": "object"}
    elif fmt is not None and fmt.type == "json_schema":
        args["json_schema"] = fmt.json_schema.schema_ if fmt.json_schema else {}
    return args


def completion_prompt(req) -> str:
    return req.prompt if isinstance(req.prompt, str) else "".join(req.prompt)


def seeds(req: Sampling) -> list[int | None]:
    """One seed per choice: the request's, then the next ones (None: unseeded)."""
    return [None if req.seed is None else req.seed + i for i in range(req.n)]


def tool_calls(req: ChatRequest, text: str) -> list[dict] | None:
    """The reply as tool calls, if it is one (forced, or offered and the model chose
    to); None: a plain answer."""
    if not req.tools or req.tool_choice == "none":
        return None
    try:
        call = json.loads(text)
    except ValueError:
        return None
    names = {t.function.name for t in req.tools}
    if not isinstance(call, dict) or call.get("name") not in names or "arguments" not in call:
        return None
    args = json.dumps(call["arguments"])
    return [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": call["name"], "arguments": args}}]  # fmt: skip


def logprobs_of(engine, h: Handle) -> dict:
    """OpenAI's `logprobs.content` of a decode made with logprobs."""
    tok = engine.tokenizer

    def entry(t: int, lp: float) -> dict:
        piece = tok.decode([t])
        return {"token": piece, "logprob": lp, "bytes": list(piece.encode())}

    tops = h.top_logprobs or ((),) * len(h.generated)
    out = []
    for t, lp, top in zip(h.generated, h.logprobs, tops, strict=False):
        out.append({**entry(t, lp), "top_logprobs": [entry(i, v) for i, v in top]})
    return {"content": out}


def usage(prompt_tokens: int, completion: int, cached: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def chat_choice(engine, req: ChatRequest, i: int, h: Handle) -> dict:
    text = h.text
    calls = tool_calls(req, text)
    finish = "tool_calls" if calls else finish_of(h)
    message: dict[str, Any] = {"role": "assistant", "content": None if calls else text,
                               "corps": {"id": h.id}}  # fmt: skip
    if calls:
        message["tool_calls"] = calls
    lp = logprobs_of(engine, h) if req.logprobs else None
    return {"index": i, "message": message, "finish_reason": finish, "logprobs": lp}


def finish_of(h: Handle) -> str:
    """A decode's finish reason as OpenAI's: "length" when its budget cut it."""
    return FINISH.get(h.finish_reason or "", "stop")


def chat_response(engine, model: str, req: ChatRequest, prompt: Prompt, replies) -> dict:
    generated = sum(len(h.generated) for h in replies)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [chat_choice(engine, req, i, h) for i, h in enumerate(replies)],
        "usage": usage(prompt.tokens, generated, prompt.cached_tokens),
        "corps": {"prompt": [h.id for h in prompt.handles]},
    }
