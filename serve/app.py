"""`corps serve`: an OpenAI-compatible HTTP API over one engine (FastAPI).

Routes: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`,
`GET /health`, `GET /metrics` (Prometheus text). Every request's calls go to the
engine's one batching loop, so concurrent requests share its fused steps.

The edge (docs/serve.md, "Security model"): a request is its API key's principal
(`principals`), reading as that principal's tenant and agent, never as the
engine's sees-everything reader; it is checked whole before anything is encoded
(`completion.prompt_of`), and what it encoded is given back if it fails, is refused or
is cut. Every failure is an OpenAI error object (`errors`), a streamed one
included: refused before the stream starts (its 4xx), or failed in it (an error
event, then `[DONE]`). Bodies, prompts, requests in flight and time per request
are bounded (`limits`).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException

from corps.cache.errors import CorpsError
from corps.engine.request.tools import syntax_of
from corps.serve import completion
from corps.serve.errors import ServeError, from_engine
from corps.serve.limits import BodyLimit, Limits, check_prompt, token_bytes
from corps.serve.messages import KEEP_SHARE, MessageCache
from corps.serve.metrics import Metrics
from corps.serve.principals import Keys, Principal, Who
from corps.serve.quotas import Gate
from corps.serve.schema import ChatRequest, CompletionRequest
from corps.serve.stream import open_stream

log = logging.getLogger("corps.serve")


def create_app(
    engine_cm, *, model: str, api_key: str | None = None, keys: Keys | None = None,
    limits: Limits | None = None, tenant_metrics: bool = False,
) -> FastAPI:  # fmt: skip
    """The app over the engine `engine_cm` opens (an async context manager, entered
    when the app starts: `Engine.open(...)`); `model` is the name it answers to.
    `keys` (or one `api_key`) authenticate requests as principals; neither: local use,
    every request tenant "local". `tenant_metrics`: /metrics has a series per tenant,
    labelled with the key file's tenant names."""
    if keys is None:
        keys = Keys.single(api_key) if api_key is not None else Keys(None)
    limits = limits or Limits()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with engine_cm as engine:
            app.state.engine = engine
            if engine.policy.charges:  # the fair policy: each tenant's weight
                engine.policy.set_weights(keys.weights())
            share = int(engine.stats().capacity * KEEP_SHARE)
            app.state.cache = MessageCache(engine, limits.keep_messages, share)
            app.state.cache.restore()  # --store: the ids a server on it kept
            app.state.token_bytes = token_bytes(engine.tokenizer)
            app.state.syntax = syntax_of(getattr(engine.tokenizer, "chat_template", None))
            context = engine.context_length
            app.state.prompt_limit = min(limits.max_prompt_tokens or context, context)
            yield
            app.state.cache.close()

    app = FastAPI(title="corps", lifespan=lifespan)
    app.state.model, app.state.limits = model, limits
    app.state.tenant_metrics = tenant_metrics
    app.state.metrics = Metrics()
    app.state.gate = Gate(limits.max_queue, tenants=len(keys.weights()))
    app.add_middleware(BodyLimit, limit=limits.max_body)

    @app.middleware("http")
    async def authenticate(request: Request, call_next):
        app.state.metrics.requests += 1
        if request.url.path.startswith("/v1/"):
            principal = keys.principal(request.headers.get("authorization", ""))
            if principal is None:
                return _refuse(app, ServeError(401, "invalid or missing API key",
                                               "authentication_error"))  # fmt: skip
            request.state.principal = principal
        return await call_next(request)

    _handlers(app)
    _routes(app)
    return app


def _handlers(app: FastAPI) -> None:
    """Every failure as an OpenAI error object."""

    @app.exception_handler(ServeError)
    async def refused(request: Request, exc: ServeError):
        return _refuse(app, exc)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or None
        what = first.get("msg", "invalid request")  # pydantic's words, never the input
        return _refuse(app, ServeError(400, f"{where}: {what}" if where else what, param=where))

    @app.exception_handler(HTTPException)
    async def http(request: Request, exc: HTTPException):
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path[:200]}"
        else:
            message = str(exc.detail)[:500]
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return _refuse(app, ServeError(exc.status_code, message, kind))

    @app.exception_handler(Exception)
    async def bug(request: Request, exc: Exception):
        log.error("unexpected %s", type(exc).__name__, exc_info=exc)
        return _refuse(app, ServeError(500, "the server failed on this request", "server_error"))


def _refuse(app: FastAPI, exc: ServeError) -> JSONResponse:
    app.state.metrics.refused(exc.status)
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


def _routes(app: FastAPI) -> None:
    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [_model_card(app.state.model)]}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        engine = app.state.engine
        audits = await engine.fidelity_report(settle=False)
        tenants = None
        if app.state.tenant_metrics:  # names only where the operator allows them
            service = engine.policy.figures() if engine.policy.charges else {}
            tenants = app.state.metrics.tenants(app.state.gate.inside_by_tenant(), service)
        text = app.state.metrics.render(engine.stats(), app.state.gate.inside, audits, tenants)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatRequest, request: Request):
        return await _answer(app, req, request.state.principal, is_chat=True)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        return await _answer(app, req, request.state.principal, is_chat=False)


def _model_card(model: str) -> dict:
    return {"id": model, "object": "model", "created": 0, "owned_by": "corps"}


def refusal(exc: BaseException, who: Who, context: int) -> BaseException:
    """What a failure of `who`'s request to an engine of `context` positions is answered
    with (ServeError for the expected ones; anything else is raised as it is: a bug)."""
    if isinstance(exc, CorpsError):
        return from_engine(exc, who.label, context)
    if isinstance(exc, TimeoutError):
        return ServeError(503, "the request ran past the server's deadline; ask for fewer "
                               "tokens or retry", "server_error")  # fmt: skip
    return exc


async def _answer(app: FastAPI, req, principal: Principal, *, is_chat: bool):
    state = app.state
    if req.model is not None and req.model != state.model:
        raise ServeError(404, f"model {req.model[:100]!r} is not served here (this is "
                              f"{state.model!r})", "not_found_error", "model")  # fmt: skip
    who = principal.acting_as(req.corps_agent)
    try:
        state.gate.take(principal)
    except ServeError:
        state.metrics.refused_tenant(who.tenant)
        raise
    prompt: completion.Prompt | None = None
    try:
        prompt = await _prompt(state, req, who, is_chat)
        args = completion.decode_args(req, prompt, who, chat=is_chat, syntax=state.syntax)
        if req.stream:  # from here the stream releases the prompt and the gate

            def keep(h):
                state.cache.keep(_reply_key(who, prompt, h), h, who.tenant)

            return await open_stream(state, req, prompt, args, who, is_chat, refusal, keep)
        with anyio.fail_after(state.limits.timeout_s):
            replies = await state.engine.decode_many(
                [dict(args, seed=s) for s in completion.seeds(req)]
            )
    except BaseException as exc:
        if prompt is not None:
            prompt.release(state.cache, ok=False)
        state.gate.leave(principal)
        raise refusal(exc, who, state.engine.context_length) from None
    for h in replies:  # a resent reply is found, not encoded again
        state.cache.keep(_reply_key(who, prompt, h), h, who.tenant)
    prompt.settle(state.engine, replies[0])
    prompt.release(state.cache, ok=True)
    state.gate.leave(principal, state.metrics.count(prompt, replies, who.tenant))
    if is_chat:
        return completion.chat_response(
            state.engine, state.cache, state.model, req, prompt, replies, state.syntax
        )
    return _completion_response(state, req, prompt, replies)


async def _prompt(state, req, who: Who, chat_request: bool) -> completion.Prompt:
    """A chat's messages in the store; a completion's prompt is its decode's header."""
    if chat_request:
        return await completion.prompt_of(state.engine, state.cache, req, who, state.prompt_limit,
                                    state.token_bytes, state.syntax)  # fmt: skip
    size = len(completion.completion_prompt(req).encode("utf-8", "surrogatepass"))
    check_prompt(size, 0, completion.max_tokens_of(req), state.prompt_limit, state.token_bytes,
                 state.engine.context_length)  # fmt: skip
    return completion.Prompt()


def _reply_key(who: Who, prompt: completion.Prompt, h) -> tuple:
    return MessageCache.key(who.reader, prompt.handles, prompt.offsets, "assistant", h.text)


def _completion_response(state, req: CompletionRequest, prompt: completion.Prompt, replies) -> dict:
    choices = [
        {"index": i, "text": _continuation(state, req, h), "finish_reason": completion.finish_of(h),
         "logprobs": None, "corps": {"id": state.cache.public_id(h)}}
        for i, h in enumerate(replies)
    ]  # fmt: skip
    prompt_tokens = replies[0].generated_from
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": state.model,
        "system_fingerprint": completion.fingerprint(state.model),
        "choices": choices,
        "usage": completion.usage(prompt_tokens, sum(len(h.generated) for h in replies), 0),
        "corps": completion.extension(state.cache, prompt, replies, req),
    }


def _continuation(state, req: CompletionRequest, h) -> str:
    """What a completion added to its prompt (all of the text with `echo`)."""
    text = h.text
    if req.echo:
        return text
    shown = completion.shown_prompt(state.engine, req)
    return (
        text[len(shown) :] if text.startswith(shown) else state.engine.tokenizer.decode(h.generated)
    )
