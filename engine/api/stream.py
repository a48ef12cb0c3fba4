"""`TextStream`: one decode's text deltas as they are generated."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio

from corps.cache.handle import Handle, bind
from corps.engine.errors import InvalidRequest
from corps.engine.exec.call import Call
from corps.engine.request.chat_format import ChatFormat
from corps.engine.request.requests import DecodeRequest


@dataclass(frozen=True)
class StreamCalls:
    """What a stream needs of its engine: its chat format, and how to check and pin a
    request into a call, queue it, wait for it, end one never queued, and free a
    message nobody will receive."""

    fmt: ChatFormat
    call: Callable[[DecodeRequest], Awaitable[Call]]
    submit: Callable[[Call], Awaitable[None]]
    wait: Callable[[Call], Awaitable[Handle]]
    end: Callable[[Call], None]
    free: Callable[[Handle], None]


class TextStream:
    """Text deltas of one decode call as they are generated; `.handle` once done.

    The deltas (the header first, then generated text) concatenate to the final
    `handle.text`; while streaming they are always a prefix of it: text that
    could still turn out to be (the start of) a stop string is held back until it
    cannot, and a partial character until it is complete. Detokenising is
    incremental (a short window of recent ids per token).

    Leaving early cancels the call (its partial tokens are rolled back, or its
    finished message freed) and returns once that is done, at the loop's next step:
    the store is then as it was. Use `async with engine.stream(...) as s: async for
    d in s:` (or `await s.aclose()`) for that to happen at once; a bare `async for`
    that breaks leaves the closing to the garbage collector.
    """

    def __init__(self, request: DecodeRequest, calls: StreamCalls) -> None:
        self._request = request
        self._calls = calls
        self._gen: Any = None
        self.handle: Handle | None = None

    def __aiter__(self) -> AsyncIterator[str]:
        return _texts(self.pieces())

    def pieces(self) -> AsyncIterator[Piece]:
        """The deltas as `Piece`s: each with the tokens sampled since the last one (and,
        for a decode asking `logprobs`, theirs), as OpenAI's stream pairs them."""
        if self._gen is not None:
            raise InvalidRequest("a stream can be iterated once; call engine.stream again")
        self._gen = self._deltas()
        return self._gen

    async def aclose(self) -> None:
        """Cancel the call if it is still running (free its message if it finished)."""
        if self._gen is not None:
            await self._gen.aclose()

    async def __aenter__(self) -> TextStream:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

    async def _deltas(self) -> AsyncIterator[Piece]:
        req = self._request
        calls = self._calls
        fmt = calls.fmt
        header = fmt.encode(req.header) if isinstance(req.header, str) else list(req.header)
        detok = _Detokenizer(fmt, req.sampling.stop, header)
        send, recv = anyio.create_memory_object_stream[Piece](max_buffer_size=math.inf)
        tokens = _Tokens()

        def on_token(tok: int) -> None:  # runs on the event loop, between steps
            tokens.add(tok, call)
            delta = detok.push(tok)
            if delta:
                send.send_nowait(tokens.piece(delta))

        call = await calls.call(self._request)
        call.on_token, call.on_done = on_token, send.close
        queued = False
        try:
            async with recv:
                await calls.submit(call)
                queued = True
                async for delta in recv:
                    yield delta
            self.handle = bind(await calls.wait(call), self._request.owner)
        except BaseException:
            call.cancelled = True
            if not queued:
                calls.end(call)  # never queued: give its pins back
            elif call.ended.is_set() and call.handle is not None and not call.replayed:
                calls.free(call.handle)  # finished, but the consumer left
                call.handle = None
            else:  # running: leaving returns once its partial tokens are rolled back
                await call.abandon()
            raise
        final = self.handle.text
        if final.startswith(detok.shown) and len(final) > len(detok.shown):
            try:
                yield tokens.piece(final[len(detok.shown) :])  # what was held back
            except BaseException:  # the consumer left at the last delta: as above
                if not call.replayed:  # (a replayed call's message is an earlier run's)
                    calls.free(self.handle)
                self.handle = None
                raise


@dataclass(frozen=True)
class Piece:
    """One delta of a stream: its text, the tokens sampled since the previous delta (a
    token whose text is held back goes with the delta that shows it), and with
    `logprobs` asked, each token's log-probability and its most likely alternatives
    (`top_logprobs`: (token, log-probability) pairs), as `Handle.logprobs` has them."""

    text: str
    tokens: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()
    top: tuple[tuple[tuple[int, float], ...], ...] = ()


class _Tokens:
    """The tokens handed to a stream since its last piece, with their log-probabilities
    read off the call as it samples them (the n-th token handed is its n-th scored)."""

    def __init__(self) -> None:
        self.handed = 0
        self.toks: list[int] = []
        self.lps: list[float] = []
        self.top: list[tuple[tuple[int, float], ...]] = []

    def add(self, tok: int, call: Any) -> None:
        k, self.handed = self.handed, self.handed + 1
        self.toks.append(tok)
        if call is not None and k < len(call.logprobs):
            self.lps.append(call.logprobs[k])
            if k < len(call.top):
                self.top.append(call.top[k])

    def piece(self, text: str) -> Piece:
        aligned = len(self.lps) == len(self.toks)  # else (a forced token) none per piece
        p = Piece(text, tuple(self.toks), tuple(self.lps) if aligned else (),
                  tuple(self.top) if aligned else ())  # fmt: skip
        self.toks, self.lps, self.top = [], [], []
        return p


async def _texts(pieces: AsyncIterator[Piece]) -> AsyncIterator[str]:
    """A stream's text deltas (`TextStream.__aiter__`); closing it closes the pieces."""
    try:
        async for p in pieces:
            yield p.text
    finally:
        await pieces.aclose()


class _Detokenizer:
    """Turns sampled ids into safe text deltas, incrementally.

    Each token decodes only a few ids: the new ones plus `CONTEXT` earlier ids
    (so tokenizers that render a token differently at the start of a text, like
    SentencePiece's leading space, still join correctly), and keeps the difference.
    """

    CONTEXT = 4

    def __init__(self, fmt, stop: tuple[str, ...], header: list[int]) -> None:
        self.fmt = fmt
        self.stop = stop
        self.hold = max((len(x) for x in stop), default=1) - 1
        self.ids = [t for t in header if t not in fmt.stop_ids]  # the handle's text starts here
        self.read = len(self.ids)  # ids[:read] are reflected in `text`
        self.text = fmt.decode(self.ids)
        self.shown = ""  # what was yielded: always a prefix of `text`
        self.stopped = False

    def push(self, tok: int) -> str:
        if tok in self.fmt.stop_ids or self.stopped:
            return ""
        self.ids.append(tok)
        ctx = max(0, self.read - self.CONTEXT)
        before = self.fmt.decode(self.ids[ctx : self.read])
        full = self.fmt.decode(self.ids[ctx:])
        if full.endswith("\ufffd") or not full.startswith(before):
            return ""  # a partial character: wait for the rest of its bytes
        self.text += full[len(before) :]
        self.read = len(self.ids)
        if any(x in self.text for x in self.stop):
            self.stopped = True  # the handle cuts here; the final flush yields the rest
            return ""
        safe = len(self.text) - self.hold
        if safe <= len(self.shown):
            return ""
        delta, self.shown = self.text[len(self.shown) : safe], self.text[:safe]
        return delta
