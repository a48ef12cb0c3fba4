"""From an OpenAI request to engine calls, and from their handles to the response.

A chat's messages become messages of the store: each attends to the ones before
it (a chain: what the baseline's causal prompt is), and the reply attends to
all of them. The server's `MessageCache` finds a message a client resends
(the replies it got included), so only what is new is encoded; in baseline
mode the radix cache does the same for the rendered prompt, salted per tenant.
The extension lets a message name a stored message by its opaque id instead
(`corps_message_id`, optionally at an `offset`): read as it is, never encoded
again, under the engine's visibility rules as the request's reader sees them.

Everything a request says is checked before its first message is encoded: the
ids it names (its tenant's, live, readable by its reader, and under the deny
policy not built on context it may not see) and its size. What it encodes is
claimed until it ends, and given back if it fails (`Prompt.release`).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from corps.cache.handle import Handle
from corps.cache.visibility import can_read
from corps.cli.serve.errors import ServeError
from corps.cli.serve.limits import check_prompt
from corps.cli.serve.messages import MessageCache
from corps.cli.serve.principals import Who
from corps.cli.serve.schema import ChatRequest, Message, NamedChoice, Sampling

#: finish reasons of the engine (`Handle.finish_reason`) as OpenAI's
FINISH = {"max_tokens": "length", "forced": "length"}
DEFAULT_MAX_TOKENS = 256


@dataclass
class Prompt:
    """A request's messages in the store: the reply's parents and where they sit."""

    handles: list[Handle] = field(default_factory=list)
    offsets: list[int | None] = field(default_factory=list)
    cached_tokens: int = 0  # tokens of messages that were in the store before the request
    claimed: list[Handle] = field(default_factory=list)  # from the cache, until it ends
    leaks: int = 0  # leaks recorded by the messages it encoded (policies allow, warn)

    @property
    def tokens(self) -> int:
        return sum(h.length for h in self.handles)

    def release(self, cache: MessageCache, *, ok: bool) -> None:
        """The request ended: what it encoded stays if `ok`, else goes (unless another
        request that found it meanwhile keeps it)."""
        claimed, self.claimed = self.claimed, []
        cache.release(claimed, ok=ok)

    def settle(self, engine, reply: Handle) -> None:
        """In baseline mode the messages hold text only and the reply re-encoded their
        text: what was cached is the prefix its radix cache gave it."""
        if engine.mode == "baseline":
            self.cached_tokens = min(reply.tokens_reused, self.tokens)

    def given_offsets(self) -> list[int | None] | None:
        return self.offsets if any(o is not None for o in self.offsets) else None


def max_tokens_of(req: Sampling) -> int:
    return getattr(req, "max_completion_tokens", None) or req.max_tokens or DEFAULT_MAX_TOKENS


async def prompt_of(
    engine, cache: MessageCache, req: ChatRequest, who: Who, limit: int, per_token: int
) -> Prompt:
    """Each message of the request as a handle (encoded, found, or named by id), after
    checking the whole request; on failure nothing it encoded is kept."""
    named = named_messages(engine, cache, req, who)
    tools = tools_prompt(req)
    new_bytes = len((tools or "").encode())
    for i, m in enumerate(req.messages):
        if i not in named:
            new_bytes += len(m.text().encode("utf-8", "surrogatepass"))
    check_prompt(new_bytes, sum(h.length for h in named.values()), max_tokens_of(req), limit,
                 per_token)  # fmt: skip
    todo: list[tuple[int | None, Message]] = list(enumerate(req.messages))
    if tools is not None:
        todo.insert(0, (None, Message(role="system", content=tools)))
    prompt = Prompt()
    try:
        for i, m in todo:
            await _add(prompt, cache, who, named.get(i) if i is not None else None, m)
    except BaseException:
        prompt.release(cache, ok=False)
        raise
    return prompt


async def _add(prompt: Prompt, cache: MessageCache, who: Who, named: Handle | None, m) -> None:
    if named is not None:
        cache.claim(named)  # kept while the request reads it
        prompt.claimed.append(named)
        prompt.handles.append(named)
        prompt.offsets.append(m.offset)
        prompt.cached_tokens += named.length
        return
    role = "system" if m.role == "developer" else m.role
    private = m.corps_visibility == "private"
    h, found = await cache.encode(
        role, m.text(), prompt.handles, prompt.offsets, who.reader, who.tenant, private
    )
    prompt.claimed.append(h)
    prompt.cached_tokens += h.length if found else 0
    prompt.leaks += 0 if found else h.leaks
    prompt.handles.append(h)
    prompt.offsets.append(None)


def named_messages(engine, cache: MessageCache, req: ChatRequest, who: Who) -> dict[int, Handle]:
    """The messages the request names by id, by their index: each its tenant's and live
    (else 404, the same for an id of another tenant: its existence is not confirmed),
    readable by its reader (else 403), and under the deny policy not built on context
    the reader may not see (else 403)."""
    deny = engine.mode == "choreographed" and engine.leak_policy == "deny"
    out = {}
    for i, m in enumerate(req.messages):
        if m.corps_message_id is None:
            continue
        where = f"messages[{i}].corps_message_id"
        h = cache.find(who.tenant, m.corps_message_id)
        if h is None:
            raise ServeError(404, f"{where}: no such message (unknown, freed, or not this "
                                  f"key's)", "not_found_error", where)  # fmt: skip
        if not can_read(who.reader, h.owner, h.visibility):
            raise ServeError(
                403, f"{where}: {who.label} may not read this message: it is private to "
                f"another agent", "permission_error", where,
            )  # fmt: skip
        if deny and any(not can_read(who.reader, s.owner, s.visibility) for s in h.sources):
            raise ServeError(
                403, f"{where}: this message's encoding carries context {who.label} may not "
                f"see (leak policy deny); name the messages it was built from that you may "
                f"read, or send its content again", "permission_error", where,
            )  # fmt: skip
        out[i] = h
    return out


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


def decode_args(req: Sampling, prompt: Prompt, who: Who, *, chat: bool) -> dict[str, Any]:
    """The `DecodeArgs` of one choice (without its seed), made as `who`."""
    args: dict[str, Any] = dict(
        parents=list(prompt.handles),
        offsets=prompt.given_offsets(),
        max_tokens=max_tokens_of(req),
        temperature=req.temperature,
        top_p=req.top_p,
        stop=tuple([req.stop] if isinstance(req.stop, str) else req.stop or ()),
        logprobs=req.logprobs,
        owner=who.reader,
        cache_salt=who.tenant,  # baseline: no prefix reused across tenants
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


def chat_choice(engine, req: ChatRequest, i: int, h: Handle, public_id: str) -> dict:
    text = h.text
    calls = tool_calls(req, text)
    finish = "tool_calls" if calls else finish_of(h)
    message: dict[str, Any] = {"role": "assistant", "content": None if calls else text,
                               "corps": {"id": public_id}}  # fmt: skip
    if calls:
        message["tool_calls"] = calls
    lp = logprobs_of(engine, h) if req.logprobs else None
    return {"index": i, "message": message, "finish_reason": finish, "logprobs": lp}


def finish_of(h: Handle) -> str:
    """A decode's finish reason as OpenAI's: "length" when its budget cut it."""
    return FINISH.get(h.finish_reason or "", "stop")


def extension(cache: MessageCache, prompt: Prompt, replies) -> dict:
    """The response's `corps` field: its prompt's message ids, and the leaks its calls
    recorded (under the warn and allow policies a leak is reported, not refused)."""
    leaks = prompt.leaks + sum(h.leaks for h in replies)
    return {"prompt": [cache.public_id(h) for h in prompt.handles], "leaks": leaks}


def chat_response(
    engine, cache: MessageCache, model: str, req: ChatRequest, prompt: Prompt, replies
) -> dict:
    generated = sum(len(h.generated) for h in replies)
    choices = [chat_choice(engine, req, i, h, cache.public_id(h)) for i, h in enumerate(replies)]
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage(prompt.tokens, generated, prompt.cached_tokens),
        "corps": extension(cache, prompt, replies),
    }
