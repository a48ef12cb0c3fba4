"""One engine worker of a cluster: an engine and a runtime in their own process.

`EngineWorker` is a plain class; `corps.patterns.cluster.runner` makes it a Ray actor
(`ray.remote(EngineWorker)`), so this module never imports Ray. Its methods are
coroutines: Ray runs them on the actor's one event loop, where the engine's
batching loop lives too, so the workflows a worker runs at once are batched
together as in one embedded engine.

A workflow's handles never leave its worker: `run` returns the result as JSON
(each message's text, role and token counts), never a handle.
"""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path
from typing import Any

from corps.engine.config import EngineConfig


class EngineWorker:
    """Builds its engine from `config` on `start()`, runs workflows with `run()`, closes
    it on `stop()`. `threads`: torch's intra-op threads in this process."""

    def __init__(self, config: EngineConfig, name: str, threads: int | None = None) -> None:
        self.config, self.name, self.threads = config, name, threads
        self._rt: Any = None
        self._ready: asyncio.Event | None = None
        self._stop: asyncio.Event | None = None
        self._serving: asyncio.Task | None = None
        self._workflows: dict[str, Any] = {}

    async def start(self) -> dict[str, Any]:
        """Load the model and open the engine; what and where this worker is."""
        import torch

        from corps.engine.exec.torch_thread import TORCH

        if self.threads:  # where the engine's steps run: a thread keeps its own count
            TORCH.call(torch.set_num_threads, self.threads)
        self._ready, self._stop = asyncio.Event(), asyncio.Event()
        self._serving = asyncio.create_task(self._serve())
        ready = asyncio.create_task(self._ready.wait())
        await asyncio.wait({self._serving, ready}, return_when=asyncio.FIRST_COMPLETED)
        if not self._ready.is_set():  # the engine failed to open: say why, as itself
            ready.cancel()
            self._serving.result()
        return dict(name=self.name, pid=os.getpid(), host=socket.gethostname(),
                    threads=TORCH.call(torch.get_num_threads))  # fmt: skip

    async def _serve(self) -> None:
        from corps.agents import Runtime
        from corps.engine import Engine

        async with Engine.open(self.config) as engine, Runtime(engine) as rt:
            self._rt = rt
            self._ready.set()
            await self._stop.wait()

    async def run(self, workflow: str, params: dict[str, Any]) -> dict[str, Any]:
        """Run one workflow (a built-in pattern's name or a `.py` file's path) on this
        worker's engine: `{"result": ...}` as JSON, or `{"error": "..."}` if it failed."""
        from corps.patterns.result import to_json
        from corps.patterns.scripts import load_workflow

        try:
            fn = self._workflows.get(workflow) or load_workflow(workflow)
            self._workflows[workflow] = fn
            return {"result": to_json(await fn(self._rt, **params))}
        except Exception as exc:  # the workflow's failure, not the worker's: reported
            return {"error": f"{type(exc).__name__}: {exc}"}

    async def stop(self) -> str | None:
        """Close the engine; the worker's trace file's text if it wrote one."""
        if self._stop is not None:
            self._stop.set()
            await asyncio.gather(self._serving, return_exceptions=True)
        trace = self.config.trace
        return Path(trace).read_text() if trace is not None and Path(trace).exists() else None
