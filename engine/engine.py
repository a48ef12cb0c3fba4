"""The public async Engine: prefill / decode with parents and offsets over one global cache."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
import torch
from rich.console import Console

from corps.cache.handle import Handle
from corps.cache.kv import KVStore
from corps.engine.core import Core
from corps.engine.errors import InvalidRequest
from corps.engine.registry import DEFAULT_MODEL, resolve_model
from corps.engine.requests import decode_request, prefill_request
from corps.engine.stats import EngineStats
from corps.engine.weights import load_weights, read_spec

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: Default KV store budget when no capacity is given.
DEFAULT_MEMORY_BUDGET = 1 << 30


class Engine:
    """One model, one global KV store, shared by every caller in the process.

    Open it with `async with Engine.open(...) as engine:`. Calls are serialized
    onto one worker thread, so the event loop stays free while the model runs.
    """

    def __init__(self, core: Core) -> None:
        self._core = core
        self._lock = anyio.Lock()

    # ---- construction ----

    @classmethod
    def load(
        cls,
        model: str = DEFAULT_MODEL,
        *,
        mode: str = "choreographed",
        device: str = "cpu",
        dtype: str = "float32",
        capacity: int | None = None,
        memory_budget: int = DEFAULT_MEMORY_BUDGET,
        console: Console | None = None,
    ) -> Engine:
        """Load synchronously (blocks). Prefer `Engine.open` in async code."""
        if dtype not in DTYPES:
            raise InvalidRequest(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise InvalidRequest(f"device {device!r} asked for, but torch sees no CUDA device")
        path = resolve_model(model, console=console)
        spec = read_spec(path)
        torch_dtype = DTYPES[dtype]
        if capacity is None:
            per_token = KVStore.bytes_per_token(
                spec.num_layers, spec.num_kv_heads, spec.head_dim, torch_dtype
            )
            capacity = max(1024, memory_budget // per_token)
        from transformers import AutoTokenizer

        weights = load_weights(path, dtype=torch_dtype, device=device)
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        return cls(Core(weights, tokenizer, model_path=path, mode=mode, capacity=capacity))

    @classmethod
    @asynccontextmanager
    async def open(cls, model: str = DEFAULT_MODEL, **kwargs: Any) -> AsyncIterator[Engine]:
        """`async with Engine.open("smollm2-135m", mode="choreographed") as engine:`."""
        engine = await anyio.to_thread.run_sync(partial(cls.load, model, **kwargs))
        yield engine

    # ---- introspection ----

    @property
    def tokenizer(self):
        """The model's Hugging Face tokenizer."""
        return self._core.tokenizer

    @property
    def model_path(self) -> Path:
        """Local HF-format directory the weights were loaded from."""
        return self._core.model_path

    @property
    def mode(self) -> str:
        return self._core.mode

    def stats(self) -> EngineStats:
        return self._core.stats()

    def free(self, handle: Handle) -> None:
        """Release a message's encoding; a call still reading it keeps it until it ends."""
        self._core.free(handle)

    # ---- calls ----

    async def prefill(self, message: str | list[int], **kwargs: Any) -> Handle:
        """Encode `message` attending to `parents` placed at `offsets`; returns its handle.

        Keywords: role="user", parents=(), offsets=None, new_offset=None, frame=True,
        owner=None, visibility=None.
        """
        (handle,) = await self.prefill_many([dict(message=message, **kwargs)])
        return handle

    async def prefill_many(self, requests: Iterable[Mapping[str, Any]]) -> list[Handle]:
        """Prefill messages that do not attend to each other, in one fused pass."""
        reqs = [prefill_request(**dict(r)) for r in requests]
        handles, _ = await self._run(self._core.prefill_many, reqs)
        return handles

    async def decode(self, **kwargs: Any) -> Handle:
        """Generate a message that starts with the role marker + `header`.

        Keywords: parents=(), offsets=None, new_offset=None, role="assistant",
        header="", frame=True, max_tokens=256, temperature=0.0, top_p=1.0, top_k=0,
        seed=None, stop=(), owner=None, visibility=None.
        """
        (handle,) = await self.decode_many([kwargs])
        return handle

    async def decode_many(self, requests: Iterable[Mapping[str, Any]]) -> list[Handle]:
        """Decode several messages in parallel; returns handles in order."""
        reqs = [decode_request(**dict(r)) for r in requests]
        return await self._run(self._core.decode_many, reqs)

    def stream(self, **kwargs: Any) -> TextStream:
        """`async for delta in engine.stream(...)`: text deltas; then `.handle`."""
        return TextStream(self, decode_request(**kwargs))

    async def _run(self, fn: Callable, *args: Any) -> Any:
        async with self._lock:
            return await anyio.to_thread.run_sync(partial(fn, *args))


class TextStream:
    """Text deltas of one decode call as they are generated; `.handle` once done."""

    def __init__(self, engine: Engine, request) -> None:
        self._engine = engine
        self._request = request
        self.handle: Handle | None = None

    async def __aiter__(self) -> AsyncIterator[str]:
        core = self._engine._core
        send, recv = anyio.create_memory_object_stream[str](max_buffer_size=math.inf)
        ids: list[int] = []
        shown = [""]

        def on_token(_: int, tok: int) -> None:
            if tok in core.fmt.stop_ids:
                return
            ids.append(tok)
            text = core.fmt.decode(ids)
            if len(text) > len(shown[0]) and not text.endswith("\ufffd"):
                delta, shown[0] = text[len(shown[0]) :], text
                anyio.from_thread.run_sync(send.send_nowait, delta)

        async def run() -> None:
            async with send:
                (self.handle,) = await self._engine._run(
                    core.decode_many, [self._request], on_token
                )
                final = self.handle.text  # flush what was held back (a partial character)
                if final.startswith(shown[0]) and len(final) > len(shown[0]):
                    send.send_nowait(final[len(shown[0]) :])

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            async with recv:
                async for delta in recv:
                    yield delta
