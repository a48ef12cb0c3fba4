"""`corps bench http`: the cost of the HTTP layer, measured side by side in one run.

The same workload twice per round, rounds alternating: N clients each making M
chat requests one after another (a user message, a greedy reply of T tokens),
once through the Python API (`prefill` + `decode` on an engine in this process)
and once through `corps serve` on a loopback port with the official `openai`
client (one per client thread), over an engine of the same settings. Every reply
is checked (a non-empty choice, its usage). Reported: requests and tokens per
second, p50 / p99 latency per request, and HTTP over Python.
"""

from __future__ import annotations

import socket
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio

PROMPTS = ["What is 7 times 6?", "Name a prime number.", "Say hello.", "What is 2 plus 2?"]


@dataclass
class Cell:
    """One workload's figures."""

    path: str  # "python" or "http"
    seconds: float
    requests: int
    tokens: int
    latencies: list[float]

    @property
    def rps(self) -> float:
        return self.requests / self.seconds

    @property
    def tps(self) -> float:
        return self.tokens / self.seconds

    def pct(self, q: float) -> float:
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, int(q * len(xs)))]


def prompt_of(client: int, i: int) -> str:
    return f"{PROMPTS[(client + i) % len(PROMPTS)]} (client {client}, question {i})"


async def python_cell(cfg, clients: int, requests: int, tokens: int) -> Cell:
    """The workload through the Python API, on a fresh engine."""
    from corps.engine.api.engine import Engine

    latencies: list[float] = []
    done = 0
    async with Engine.open(cfg) as engine:

        async def client(c: int) -> None:
            nonlocal done
            for i in range(requests):
                t0 = time.perf_counter()
                q = await engine.prefill(prompt_of(c, i))
                reply = await engine.decode(parents=[q], max_tokens=tokens, temperature=0.0)
                if not reply.generated:
                    raise RuntimeError(f"an empty reply to client {c}, question {i}")
                done += len(reply.generated)
                latencies.append(time.perf_counter() - t0)
                engine.free(q)
                engine.free(reply)

        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for c in range(clients):
                tg.start_soon(client, c)
        seconds = time.perf_counter() - t0
    return Cell("python", seconds, clients * requests, done, latencies)


class Server:
    """`corps serve`'s app on a free loopback port, in a thread of its own."""

    def __init__(self, cfg, model: str) -> None:
        import uvicorn

        from corps.cli.serve.app import create_app
        from corps.engine.api.engine import Engine

        self.ready = threading.Event()

        @asynccontextmanager
        async def opened():
            async with Engine.open(cfg) as engine:
                self.ready.set()
                yield engine

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(256)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        app = create_app(opened(), model=model)
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]})

    def __enter__(self) -> Server:
        self.thread.start()
        if not self.ready.wait(600):
            raise RuntimeError("the server's engine did not open in 10 minutes")
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(60)


def http_cell(cfg, model: str, clients: int, requests: int, tokens: int) -> Cell:
    """The workload through `corps serve` and the `openai` client."""
    from openai import OpenAI

    with Server(cfg, model) as server:

        def client(c: int) -> tuple[int, list[float]]:
            api = OpenAI(base_url=server.url, api_key="none", max_retries=0)
            got, lat = 0, []
            for i in range(requests):
                t0 = time.perf_counter()
                r = api.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": prompt_of(c, i)}],
                    max_tokens=tokens, temperature=0.0,
                )  # fmt: skip
                if not r.choices or r.usage.completion_tokens < 1:
                    raise RuntimeError(f"an empty reply to client {c}, question {i}")
                got += r.usage.completion_tokens
                lat.append(time.perf_counter() - t0)
            return got, lat

        t0 = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            results = list(pool.map(client, range(clients)))
        seconds = time.perf_counter() - t0
    latencies = [x for _, lat in results for x in lat]
    return Cell("http", seconds, clients * requests, sum(g for g, _ in results), latencies)


def measure(cfg, model: str, clients: int, requests: int, tokens: int, rounds: int):
    """`rounds` of (python, http); each path's cells, in order."""
    cells: dict[str, list[Cell]] = {"python": [], "http": []}
    for _ in range(rounds):
        cells["python"].append(anyio.run(python_cell, cfg, clients, requests, tokens))
        cells["http"].append(http_cell(cfg, model, clients, requests, tokens))
    return cells


def table(cells: dict[str, list[Cell]], title: str):
    from rich.table import Table

    t = Table(title=title)
    for col in ("path", "requests/s", "tokens/s", "p50 latency", "p99 latency", "vs python"):
        t.add_column(col, justify="right")
    base = statistics.median(c.tps for c in cells["python"])
    for path, runs in cells.items():
        tps = statistics.median(c.tps for c in runs)
        rps = statistics.median(c.rps for c in runs)
        p50 = statistics.median(c.pct(0.5) for c in runs)
        p99 = statistics.median(c.pct(0.99) for c in runs)
        t.add_row(path, f"{rps:.2f}", f"{tps:.1f}", f"{p50 * 1000:.0f} ms", f"{p99 * 1000:.0f} ms",
                  f"{tps / base:.2f}x")  # fmt: skip
    return t
