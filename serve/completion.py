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

import functools
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from corps.cache.handle import Handle
from corps.cache.visibility import can_read
from corps.engine.request.tools import Offer, Syntax
from corps.serve.errors import ServeError
from corps.serve.limits import check_prompt
from corps.serve.messages import MessageCache
from corps.serve.principals import Who
from corps.serve.schema import ChatRequest, Message, NamedChoice, Sampling

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
    engine, cache: MessageCache, req: ChatRequest, who: Who, limit: int, per_token: int,
    syntax: Syntax,
) -> Prompt:  # fmt: skip
    """Each message of the request as a handle (encoded, found, or named by id), after
    checking the whole request; on failure nothing it encoded is kept. Earlier tool
    calls are written in `syntax`, and the tools offered told in a system message."""
    named = named_messages(engine, cache, req, who)
    offer = offer_of(req, syntax)
    tools = offer.instructions() if offer is not None else None
    new_bytes = len((tools or "").encode())
    for i, m in enumerate(req.messages):
        if i not in named:
            new_bytes += len(m.text(syntax).encode("utf-8", "surrogatepass"))
    check_prompt(new_bytes, sum(h.length for h in named.values()), max_tokens_of(req), limit,
                 per_token, engine.context_length)  # fmt: skip
    todo: list[tuple[int | None, Message]] = list(enumerate(req.messages))
    if tools is not None:
        todo.insert(0, (None, Message(role="system", content=tools)))
    prompt = Prompt()
    try:
        for i, m in todo:
            await _add(prompt, cache, who, named.get(i) if i is not None else None, m, syntax)
    except BaseException:
        prompt.release(cache, ok=False)
        raise
    return prompt


async def _add(
    prompt: Prompt, cache: MessageCache, who: Who, named: Handle | None, m, syntax: Syntax
) -> None:
    if named is not None:
        cache.claim(named)  # kept while the request reads it
        prompt.claimed.append(named)
        prompt.handles.append(named)
        prompt.offsets.append(m.offset)
        prompt.cached_tokens += named.length
        return
    role = {"developer": "system", "function": "tool"}.get(m.role, m.role)
    private = m.corps_visibility == "private"
    h, found = await cache.encode(
        role, m.text(syntax), prompt.handles, prompt.offsets, who.reader, who.tenant, private
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


def offer_of(req: ChatRequest, syntax: Syntax) -> Offer | None:
    """The tools the request offers the reply (None: none, or tool_choice "none"), with
    the response format's schema as what its content must match."""
    if not req.tools or req.tool_choice == "none":
        return None
    choice = req.tool_choice
    name = choice.function["name"] if isinstance(choice, NamedChoice) else (choice or "auto")
    tools = tuple((t.function.name, t.function.description, t.function.parameters)
                  for t in req.tools)  # fmt: skip
    return Offer(syntax, tools, name, req.parallel_tool_calls, content_schema(req))


def content_schema(req: ChatRequest) -> dict | None:
    """The JSON schema `response_format` asks content to match (None: free text)."""
    fmt = req.response_format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "object"}
    return fmt.json_schema.schema_ if fmt.json_schema else {}


def decode_args(
    req: Sampling, prompt: Prompt, who: Who, *, chat: bool, syntax: Syntax | None = None
) -> dict[str, Any]:
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
        tenant=who.tenant,  # its work counts against its tenant's share (policy "fair")
    )
    if req.logit_bias:
        args["logit_bias"] = {int(t): b for t, b in req.logit_bias.items()}
    if not chat:  # a completion continues its prompt, unframed
        args.update(frame=False, header=completion_prompt(req))
        return args
    if req.top_logprobs:  # type: ignore[attr-defined]
        args["top_logprobs"] = req.top_logprobs  # type: ignore[attr-defined]
    offer = offer_of(req, syntax) if syntax is not None else None  # type: ignore[arg-type]
    schema = content_schema(req)  # type: ignore[arg-type]
    if offer is not None:  # content or calls, each call well-formed, content the schema's
        args["grammar"] = offer.grammar()
    elif schema is not None:
        args["json_schema"] = schema
    return args


def completion_prompt(req) -> str:
    return req.prompt if isinstance(req.prompt, str) else "".join(req.prompt)


def shown_prompt(engine, req) -> str:
    """A completion's prompt as its decode's text begins with it (its header decoded)."""
    fmt = engine.chat
    return fmt.decode([t for t in fmt.encode(completion_prompt(req)) if t not in fmt.stop_ids])


def seeds(req: Sampling) -> list[int | None]:
    """One seed per choice: the request's, then the next ones (None: unseeded)."""
    return [None if req.seed is None else req.seed + i for i in range(req.n)]


def logprobs_of(engine, h: Handle) -> dict:
    """OpenAI's `logprobs.content` of a decode made with logprobs."""
    return {"content": logprob_entries(engine, h.generated, h.logprobs, h.top_logprobs)}


def logprob_entries(engine, tokens, logprobs, tops) -> list[dict]:
    """OpenAI's entries of `logprobs.content`: one per token with its log-probability
    and, from `tops` (None: none asked), its most likely alternatives."""
    tok = engine.tokenizer

    def entry(t: int, lp: float) -> dict:
        piece = tok.decode([t])
        return {"token": piece, "logprob": lp, "bytes": list(piece.encode())}

    tops = tops or ((),) * len(tokens)
    return [
        {**entry(t, lp), "top_logprobs": [entry(i, v) for i, v in top]}
        for t, lp, top in zip(tokens, logprobs, tops, strict=False)
    ]


def usage(prompt_tokens: int, completion: int, cached: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def reply_of(req: ChatRequest, syntax: Syntax, h: Handle) -> tuple[str | None, list, str]:
    """A reply's content, its tool calls (`tools.Call`) and its finish reason: "tool_calls"
    (or the legacy "function_call") when it called, "length" when its budget cut it."""
    finish = finish_of(h)
    offer = offer_of(req, syntax)
    if offer is None:
        return h.text, [], finish
    content, calls = offer.parse(h.text)
    if calls and finish != "length":
        finish = "function_call" if req.functions is not None else "tool_calls"
    return content, calls, finish


def chat_choice(
    engine, req: ChatRequest, i: int, h: Handle, public_id: str | None, syntax: Syntax
) -> dict:
    content, calls, finish = reply_of(req, syntax, h)
    message: dict[str, Any] = {"role": "assistant", "content": content,
                               "corps": {"id": public_id}}  # fmt: skip
    if calls and req.functions is not None:
        message["function_call"] = calls[0].openai()["function"]
    elif calls:
        message["tool_calls"] = [c.openai() for c in calls]
    lp = logprobs_of(engine, h) if req.logprobs else None
    return {"index": i, "message": message, "finish_reason": finish, "logprobs": lp}


@functools.cache
def fingerprint(model: str) -> str:
    """OpenAI's `system_fingerprint`: what served the reply (corps' version, the model);
    read from the package's metadata once."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        ours = version("corps")
    except PackageNotFoundError:
        ours = "dev"
    return f"fp_corps-{ours}-{model}"[:120]


def finish_of(h: Handle) -> str:
    """A decode's finish reason as OpenAI's: "length" when its budget cut it."""
    return FINISH.get(h.finish_reason or "", "stop")


def extension(cache: MessageCache, prompt: Prompt, replies, req) -> dict:
    """The response's `corps` field: its prompt's message ids, the leaks its calls
    recorded (under the warn and allow policies a leak is reported, not refused), and
    the request's fields the server does not know and so ignored (docs/serve.md)."""
    leaks = prompt.leaks + sum(h.leaks for h in replies)
    ext = {"prompt": [cache.public_id(h) for h in prompt.handles], "leaks": leaks}
    ignored = ignored_fields(req)
    if ignored:
        ext["ignored"] = ignored
    return ext


def ignored_fields(req) -> list[str]:
    """The top-level fields of a request the server ignores (the first 20, names cut to
    40 characters): it accepts unknown fields, as OpenAI-compatible servers do, and says so."""
    return sorted(str(k)[:40] for k in (req.model_extra or {}))[:20]


def chat_response(
    engine, cache: MessageCache, model: str, req: ChatRequest, prompt: Prompt, replies,
    syntax: Syntax,
) -> dict:  # fmt: skip
    generated = sum(len(h.generated) for h in replies)
    choices = [chat_choice(engine, req, i, h, cache.public_id(h), syntax)
               for i, h in enumerate(replies)]  # fmt: skip
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": fingerprint(model),
        "choices": choices,
        "usage": usage(prompt.tokens, generated, prompt.cached_tokens),
        "corps": extension(cache, prompt, replies, req),
    }
