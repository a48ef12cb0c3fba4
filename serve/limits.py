"""What one request may cost `corps serve`: its body, its prompt, a place in the queue,
and its time.

- `BodyLimit`: an ASGI middleware that refuses a body past `max_body` bytes with 413
  before reading it (by its Content-Length) or as soon as it passes the limit
  (a chunked body): a 20 MB body is never held in memory.
- `Limits.check_prompt`: a prompt's tokens bounded from below by its bytes (no
  token covers more than `token_bytes` bytes of text), so a prompt far past the
  limit is refused before it is tokenized.
- `max_queue`: at most that many requests in the server at once; the next gets 429
  with `Retry-After` (`corps.serve.quotas.Gate`, which holds each key to its quota too).
- `timeout_s`: the deadline of one request, stream included (503 past it).
- `keep_messages`: how many encoded messages the server keeps for resends and ids.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from starlette.exceptions import HTTPException

from corps.serve.errors import ServeError, context_exceeded, error_body

MB = 1 << 20


@dataclass(frozen=True)
class Limits:
    max_body: int = 4 * MB  # bytes of a request body
    max_queue: int = 256  # requests in the server at once
    timeout_s: float = 600.0  # seconds a request (a stream included) may take
    max_prompt_tokens: int | None = None  # None: the model's context length
    shutdown_grace_s: float = 30.0  # seconds SIGTERM waits for requests before cancelling
    keep_messages: int = 4096  # encoded messages kept for resends and ids (LRU; 0: none)

    def __post_init__(self) -> None:
        for name in ("max_body", "max_queue", "timeout_s", "shutdown_grace_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.keep_messages < 0:
            raise ValueError(f"keep_messages must be >= 0, got {self.keep_messages}")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise ValueError(f"max_prompt_tokens must be >= 1, got {self.max_prompt_tokens}")


def token_bytes(tokenizer) -> int:
    """The most UTF-8 bytes of text one token of `tokenizer` can stand for (bounded
    from above: each vocabulary entry's own spelling, which is never shorter)."""
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    return max(len(p.encode("utf-8", "surrogatepass")) for p in pieces if p is not None)


def check_prompt(
    text_bytes: int, named_tokens: int, max_new: int, limit: int, per_token: int, context: int
):  # fmt: skip
    """ServeError unless a prompt of `text_bytes` new bytes besides `named_tokens`
    tokens already encoded may fit `limit` (the server's, at most the model's
    `context`) with `max_new` tokens generated: past the context, OpenAI's 400
    `context_length_exceeded`; past a lower limit of the server's, 413."""
    at_least = named_tokens + text_bytes // per_token
    if max_new >= context or at_least + max_new > context:
        raise context_exceeded(context)
    if max_new >= limit:
        raise ServeError(400, f"max_tokens: {max_new} is not below the model's context "
                              f"length {limit}; ask for fewer", param="max_tokens")  # fmt: skip
    if at_least + max_new > limit:
        raise ServeError(
            413, f"the prompt is at least {at_least} tokens; with max_tokens {max_new} it "
            f"passes the limit of {limit}: send less", param="messages",
        )  # fmt: skip


class TooLarge(HTTPException):
    """A body past the limit (an HTTPException so FastAPI's body parsing lets it through)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is over the limit of {limit} bytes")


class BodyLimit:
    """ASGI middleware: 413 for a body over `limit` bytes, without buffering it."""

    def __init__(self, app, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            return await self._refuse(send)
        seen = 0

        async def limited():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise TooLarge(self.limit)
            return message

        await self.app(scope, limited, send)

    async def _refuse(self, send) -> None:
        body = json.dumps(
            error_body(f"the request body is over the limit of {self.limit} bytes",
                       "invalid_request_error")
        ).encode()  # fmt: skip
        headers = [(b"content-type", b"application/json"), (b"connection", b"close"),
                   (b"content-length", str(len(body)).encode())]  # fmt: skip
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})
