"""`corps serve`'s app in a thread of this process, on a free loopback port: what the
tests and `corps bench http` run their clients against."""

from __future__ import annotations

import socket
import threading
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from corps.serve.app import create_app


class BackgroundServer:
    """`with BackgroundServer(Engine.open(...), model="m") as s:` serves at `s.url`
    once the engine is open (`s.engine`); leaving stops the server and closes it."""

    def __init__(
        self, engine_cm: AbstractAsyncContextManager, *, model: str, api_key: str | None = None,
        keys=None, limits=None, tenant_metrics: bool = False,
    ) -> None:  # fmt: skip
        import uvicorn

        self.ready = threading.Event()
        self.engine = None  # the server's engine, once ready (its stats are thread-safe)

        @asynccontextmanager
        async def opened():
            async with engine_cm as engine:
                self.engine = engine
                self.ready.set()
                yield engine

        self.app = create_app(opened(), model=model, api_key=api_key, keys=keys, limits=limits,
                              tenant_metrics=tenant_metrics)  # fmt: skip
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(256)  # connections wait in the backlog until the server serves
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        grace = limits.shutdown_grace_s if limits is not None else None
        self.server = uvicorn.Server(
            uvicorn.Config(self.app, log_level="warning", timeout_graceful_shutdown=grace)
        )
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]})

    def __enter__(self) -> BackgroundServer:
        self.thread.start()
        if not self.ready.wait(600):
            self.__exit__()
            raise RuntimeError("the server's engine did not open in 10 minutes")
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(60)
