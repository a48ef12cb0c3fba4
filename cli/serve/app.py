"""`corps serve`: an OpenAI-compatible HTTP API over one engine (FastAPI).

Routes: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`,
`GET /health`, `GET /metrics` (Prometheus text). Every request's calls go to the
engine's one batching loop, so concurrent requests share its fused steps. A bad
request (malformed JSON, a field of the wrong type, a schema that does not
compile, an unknown or freed message id, a context too long) is answered 4xx
with an OpenAI-style error object before anything is queued; a client that
goes away mid-stream cancels its call, which gives back what it held.
"""

from __future__ import annotations

import json
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from corps.cache.errors import CacheFullError, CorpsError, InvalidRequest, UnknownHandle
from corps.cache.visibility import AccessDenied, LeakageError
from corps.cli.serve import chat
from corps.cli.serve.metrics import Metrics
from corps.cli.serve.schema import ChatRequest, CompletionRequest, error_body
from corps.engine.errors import EngineBusy, EngineClosed


def create_app(engine_cm, *, model: str, api_key: str | None = None) -> FastAPI:
    """The app over the engine `engine_cm` opens (an async context manager, entered
    when the app starts: `Engine.open(...)`); `model` is the name it answers to."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with engine_cm as engine:
            app.state.engine = engine
            app.state.cache = chat.MessageCache(engine)
            yield
            app.state.cache.clear()

    app = FastAPI(title="corps", lifespan=lifespan)
    app.state.model = model
    app.state.metrics = Metrics()

    @app.middleware("http")
    async def guard(request: Request, call_next):
        app.state.metrics.requests += 1
        if api_key is not None and request.url.path.startswith("/v1/"):
            given = request.headers.get("authorization", "")
            if not secrets.compare_digest(given, f"Bearer {api_key}"):
                return _error(401, "invalid or missing API key", "authentication_error")
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        message = f"{where}: {first.get('msg', 'invalid request')}" if where else str(exc)
        return _error(400, message, "invalid_request_error", where or None)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [_model_card(app.state.model)]}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        text = app.state.metrics.render(app.state.engine.stats())
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatRequest):
        return await _answer(app, req, is_chat=True)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest):
        return await _answer(app, req, is_chat=False)

    return app


def _model_card(model: str) -> dict:
    return {"id": model, "object": "model", "created": 0, "owned_by": "corps"}


def _error(status: int, message: str, kind: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, kind, param), status_code=status)


def _status_of(exc: BaseException) -> tuple[int, str]:
    """The HTTP status and OpenAI error type of an engine error."""
    if isinstance(exc, UnknownHandle):
        return 404, "not_found_error"
    if isinstance(exc, AccessDenied | LeakageError):
        return 403, "permission_error"
    if isinstance(exc, EngineBusy):
        return 429, "rate_limit_error"
    if isinstance(exc, CacheFullError):
        return 507, "server_error"
    if isinstance(exc, EngineClosed):
        return 503, "server_error"
    if isinstance(exc, InvalidRequest):
        return 400, "invalid_request_error"
    return 500, "server_error"


async def _answer(app: FastAPI, req, *, is_chat: bool):
    state = app.state
    if req.model is not None and req.model != state.model:
        return _error(404, f"model {req.model!r} is not served here (this is {state.model!r})",
                      "not_found_error", "model")  # fmt: skip
    if req.stream and req.n > 1:
        return _error(400, "stream with n > 1 is not supported; ask n=1 or stream=false",
                      "invalid_request_error", "n")  # fmt: skip
    try:
        prompt = await _prompt(state, req, is_chat)
        args = chat.decode_args(req, prompt, chat=is_chat)
        if req.stream:
            return _stream(app, req, prompt, args, is_chat)
        replies = await state.engine.decode_many([dict(args, seed=s) for s in chat.seeds(req)])
    except CorpsError as exc:
        status, kind = _status_of(exc)
        state.metrics.errors += 1
        return _error(status, str(exc), kind)
    for h in replies:  # a resent reply is found, not encoded again
        state.cache.keep(_reply_key(req, prompt, h), h)
    prompt.settle(state.engine, replies[0])
    state.metrics.count(prompt, replies)
    if is_chat:
        return chat.chat_response(state.engine, state.model, req, prompt, replies)
    return _completion_response(state, req, prompt, replies)


async def _prompt(state, req, chat_request: bool) -> chat.Prompt:
    """A chat's messages in the store; a completion's prompt is its decode's header."""
    if chat_request:
        return await chat.prompt_of(state.engine, state.cache, req)
    return chat.Prompt()


def _reply_key(req, prompt: chat.Prompt, h) -> tuple:
    return chat.MessageCache.key(req.corps_agent, prompt.handles, prompt.offsets,
                                 "assistant", h.text)  # fmt: skip


def _completion_response(state, req: CompletionRequest, prompt: chat.Prompt, replies) -> dict:
    choices = [
        {"index": i, "text": _continuation(state, req, h), "finish_reason": chat.finish_of(h),
         "logprobs": None, "corps": {"id": h.id}}
        for i, h in enumerate(replies)
    ]  # fmt: skip
    prompt_tokens = replies[0].generated_from
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": state.model,
        "choices": choices,
        "usage": chat.usage(prompt_tokens, sum(len(h.generated) for h in replies), 0),
    }


def _continuation(state, req: CompletionRequest, h) -> str:
    """What a completion added to its prompt (all of the text with `echo`)."""
    text = h.text
    prompt = chat.completion_prompt(req)
    if req.echo or not text.startswith(prompt):
        return text if req.echo else state.engine.tokenizer.decode(h.generated)
    return text[len(prompt) :]


def _stream(app: FastAPI, req, prompt: chat.Prompt, args: dict, is_chat: bool):
    """Server-sent events: a chunk per text delta, the finish reason, usage if asked,
    then `[DONE]`. Leaving early (the client went away) cancels the call."""
    state = app.state
    cid = f"{'chatcmpl' if is_chat else 'cmpl'}-{uuid.uuid4().hex}"
    kind = "chat.completion.chunk" if is_chat else "text_completion"
    created = int(time.time())

    def chunk(delta: dict | str | None, finish: str | None = None, **extra: Any) -> str:
        if is_chat:
            choice = {"index": 0, "delta": delta or {}, "finish_reason": finish, "logprobs": None}
        else:
            choice = {"index": 0, "text": delta or "", "finish_reason": finish, "logprobs": None}
        body = {"id": cid, "object": kind, "created": created, "model": state.model,
                "choices": [] if extra.get("usage") else [choice], **extra}  # fmt: skip
        return f"data: {json.dumps(body)}\n\n"

    # made now: a request the engine refuses (a bad constraint) fails before the 200
    stream = state.engine.stream(**dict(args, seed=req.seed))

    async def events() -> AsyncIterator[str]:
        async with stream:
            if is_chat:
                yield chunk({"role": "assistant", "content": ""})
            try:
                async for delta in stream:
                    yield chunk({"content": delta} if is_chat else delta)
            except CorpsError as exc:  # failed mid-stream: an error event, then the end
                _, err_kind = _status_of(exc)
                yield f"data: {json.dumps(error_body(str(exc), err_kind))}\n\n"
                return
            h = stream.handle
        state.cache.keep(_reply_key(req, prompt, h), h)
        prompt.settle(state.engine, h)
        state.metrics.count(prompt, [h])
        finish = chat.finish_of(h)
        yield chunk({} if is_chat else "", finish, corps={"id": h.id})
        if req.stream_options is not None and req.stream_options.include_usage:
            used = chat.usage(prompt.tokens, len(h.generated), prompt.cached_tokens)
            yield chunk(None, usage=used)
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")
