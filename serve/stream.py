"""A streamed reply of `corps serve`: server-sent events in OpenAI's chunk format.

One stream per choice (`n` of them, their chunks interleaved by `index`). Each
call is admitted and its first delta awaited before the 200, so a refusal is a
4xx like the unstreamed one; a failure later is an error event, then `[DONE]`.
Text comes as `content` deltas; a reply that calls tools as tool-call deltas
(`tools.Streamer`): the first of each call with its index, id, type and name,
then fragments of its arguments, the choice's last chunk `finish_reason:
"tool_calls"` (or "length" if its budget cut it). Logprobs, when asked, come
with the content chunk that shows their tokens, as OpenAI sends them (tokens
whose text nothing showed, and a tool-calling reply's, with the choice's last
chunk): a choice's chunks join to the unstreamed reply's logprobs. With
`stream_options.include_usage` a usage chunk follows. However the response ends
(finished, failed, the client gone), a call not finished is cancelled and the
prompt's messages are given back unless it succeeded, once: before `[DONE]`, so a
client's next request finds the store as it was (a client gone early: by `end`).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import anyio
from fastapi.responses import StreamingResponse

from corps.serve import completion
from corps.serve.errors import ServeError
from corps.serve.tools import Streamer

log = logging.getLogger("corps.serve")


@dataclass
class Choice:
    """One streamed choice: its engine stream, its deltas, and what it has shown."""

    index: int
    stream: Any  # the engine's TextStream
    deltas: Any = None  # its async iterator of pieces (`TextStream.pieces`)
    first: Any = None  # the piece awaited before the 200
    skip: int = 0  # completions: prompt characters still to drop
    calls: Streamer | None = None  # chat with tools: text or tool-call deltas
    handle: Any = None  # once finished
    done: bool = False
    sent: int = 0  # logprobs entries sent with its content chunks


async def _next(deltas, deadline: float) -> Any:
    """The stream's next piece (None: it ended), by `deadline` (TimeoutError)."""
    with anyio.fail_after(max(deadline - anyio.current_time(), 0)):
        try:
            return await deltas.__anext__()
        except StopAsyncIteration:
            return None


async def open_stream(
    state, req, prompt: completion.Prompt, args: dict, who, is_chat: bool, refusal: Callable,
    keep: Callable,
) -> StreamingResponse:  # fmt: skip
    """The response of a streamed request whose prompt is in the store. `refusal` maps
    a failure to its ServeError; `keep(handle)` keeps a finished reply."""
    deadline = anyio.current_time() + state.limits.timeout_s
    offer = completion.offer_of(req, state.syntax) if is_chat else None
    skip = 0 if is_chat or req.echo else len(completion.shown_prompt(state.engine, req))
    choices = [
        Choice(i, state.engine.stream(**dict(args, seed=seed)), skip=skip,
               calls=Streamer(offer) if offer is not None else None)
        for i, seed in enumerate(completion.seeds(req))
    ]  # fmt: skip

    async def admit(c: Choice) -> None:
        c.deltas = c.stream.pieces()
        c.first = await _next(c.deltas, deadline)

    try:  # every choice admitted, and its first delta come, before the 200
        async with anyio.create_task_group() as tg:
            for c in choices:
                tg.start_soon(admit, c)
    except BaseException as exc:
        with anyio.CancelScope(shield=True):
            for c in choices:
                await c.stream.aclose()
        if isinstance(exc, BaseExceptionGroup):  # one choice's refusal is the request's
            raise _first(exc) from None
        raise
    sse = _Chunks(state, req, is_chat)
    ok = False
    released = False
    spent = 0  # the tokens its key's quota is charged

    async def give_back() -> None:
        """Once: cancel what did not finish and give the prompt back (or keep it, if
        the reply succeeded); before `[DONE]`, so a client's next request sees it."""
        nonlocal released
        if released:
            return
        released = True
        with anyio.CancelScope(shield=True):
            if not ok:
                for c in choices:
                    await c.stream.aclose()
            prompt.release(state.cache, ok=ok)

    async def events() -> AsyncIterator[str]:
        nonlocal ok, spent
        try:
            if is_chat:  # a reply that may call tools has no content until it shows text
                role = {"role": "assistant"} if offer is not None else {
                    "role": "assistant", "content": ""}  # fmt: skip
                for c in choices:
                    yield sse.chunk(c.index, role)
            async for c, piece in _interleaved(choices, deadline):
                lp = _logprobs(state, req, c, piece, is_chat)
                for d in _shown(c, piece.text, is_chat):
                    yield sse.chunk(c.index, d, logprobs=lp)
            for c in choices:
                keep(c.handle)
                prompt.settle(state.engine, c.handle)
            spent = state.metrics.count(prompt, [c.handle for c in choices], who.tenant)
            ok = True
            for c in choices:
                yield sse.chunk(c.index, {} if is_chat else "", **_last(state, req, prompt, c))
            if req.stream_options is not None and req.stream_options.include_usage:
                yield sse.usage(prompt, [c.handle for c in choices], is_chat)
        except Exception as exc:  # failed mid-stream: an error event, then the end
            err = refusal(exc, who, state.engine.context_length)
            if not isinstance(err, ServeError):
                log.error("unexpected %s in a stream", type(exc).__name__, exc_info=exc)
                err = ServeError(500, "the server failed on this request", "server_error")
            state.metrics.refused(err.status, who.tenant)
            await give_back()
            yield f"data: {json.dumps(err.body())}\n\n"
        await give_back()
        yield "data: [DONE]\n\n"

    async def end() -> None:
        await give_back()  # the response ended early (the client gone): not yet done
        state.gate.leave(who.principal, spent)

    return _Events(events(), end)


def _first(group: BaseExceptionGroup) -> BaseException:
    """The first error of a task group's, its own groups opened."""
    exc = group.exceptions[0]
    return _first(exc) if isinstance(exc, BaseExceptionGroup) else exc


async def _interleaved(choices: list[Choice], deadline: float):
    """(choice, delta) from every choice in turn until all have ended (each choice's
    deltas are buffered by the engine meanwhile, so none waits on the others)."""
    pending = {c.index: c.first for c in choices}
    while not all(c.done for c in choices):
        for c in choices:
            if c.done:
                continue
            delta = pending.pop(c.index, None)
            if delta is None:
                delta = await _next(c.deltas, deadline)
            if delta is None:
                c.done, c.handle = True, c.stream.handle
                continue
            yield c, delta


def _logprobs(state, req, c: Choice, piece, is_chat: bool) -> dict | None:
    """The logprobs of a content chunk: its piece's tokens' (None when not asked, for
    a reply that may call tools, or for a piece without them)."""
    if not (req.logprobs and is_chat) or c.calls is not None or not piece.logprobs:
        return None
    top = piece.top if req.top_logprobs else None
    entries = completion.logprob_entries(state.engine, piece.tokens, piece.logprobs, top)
    c.sent += len(entries)
    return {"content": entries}


def _shown(c: Choice, delta: str, is_chat: bool) -> list[dict | str]:
    """What a choice's text delta shows: content, tool-call deltas, or (completions)
    text past the prompt."""
    if not is_chat:
        shown, c.skip = delta[c.skip :], max(0, c.skip - len(delta))
        return [shown] if shown else []
    if c.calls is not None:
        return c.calls.feed(delta)
    return [{"content": delta}]


def _last(state, req, prompt: completion.Prompt, c: Choice) -> dict:
    """The extra fields of a choice's last chunk: finish reason, logprobs, the ids."""
    h = c.handle
    finish = completion.finish_of(h)
    if c.calls is not None:
        _, _, finish = completion.reply_of(req, state.syntax, h)
    ext = {**completion.extension(state.cache, prompt, [h], req), "id": state.cache.public_id(h)}
    is_chat = getattr(req, "messages", None) is not None
    lp = completion.logprobs_of(state.engine, h) if req.logprobs and is_chat else None
    if lp is not None:  # what the content chunks did not carry
        lp = {"content": lp["content"][c.sent :]}
    return {"finish": finish, "logprobs": lp, "corps": ext}


class _Chunks:
    """The chunk bodies of one streamed response."""

    def __init__(self, state, req, is_chat: bool) -> None:
        self.state, self.req, self.is_chat = state, req, is_chat
        self.id = f"{'chatcmpl' if is_chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.kind = "chat.completion.chunk" if is_chat else "text_completion"
        self.created = int(time.time())

    def _body(self, choices: list, **extra: Any) -> str:
        body = {"id": self.id, "object": self.kind, "created": self.created,
                "model": self.state.model,
                "system_fingerprint": completion.fingerprint(self.state.model),
                "choices": choices, **extra}  # fmt: skip
        return f"data: {json.dumps(body)}\n\n"

    def chunk(
        self, index: int, delta: dict | str, finish: str | None = None, logprobs=None, **extra
    ) -> str:
        if self.is_chat:
            choice = {"index": index, "delta": delta, "finish_reason": finish,
                      "logprobs": logprobs}  # fmt: skip
        else:
            choice = {"index": index, "text": delta, "finish_reason": finish,
                      "logprobs": logprobs}  # fmt: skip
        return self._body([choice], **extra)

    def usage(self, prompt: completion.Prompt, replies: list, is_chat: bool) -> str:
        prompt_tokens = prompt.tokens if is_chat else replies[0].generated_from
        generated = sum(len(h.generated) for h in replies)
        return self._body(
            [], usage=completion.usage(prompt_tokens, generated, prompt.cached_tokens)
        )


class _Events(StreamingResponse):
    """Server-sent events that run `end` once the response is over, however it ended
    (finished, failed, or the client gone before or while it was sent)."""

    def __init__(self, events: AsyncIterator[str], end) -> None:
        super().__init__(events, media_type="text/event-stream")
        self._end = end

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._end()
