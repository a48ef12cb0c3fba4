"""serve/limits.py: what one request may cost `corps serve`. Large bodies refused
without being held (the server's RSS, measured on a `corps serve` process), a full
server answering 429, a deadline answering 503, and a load of 64 streams (half cut)
with a burst of refused bodies after which the store is back where it was, /health
and /metrics answering throughout; SIGTERM under load exits within its grace."""

from __future__ import annotations

import concurrent.futures
import json
import signal
import socket
import subprocess
import sys
import threading

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")
psutil = pytest.importorskip("psutil")

from corps.engine.api.engine import Engine  # noqa: E402
from corps.serve.background import BackgroundServer  # noqa: E402
from corps.serve.limits import Limits  # noqa: E402

from helpers import park_decodes  # noqa: E402

KEY = "sk-limits-test"
AUTH = {"Authorization": f"Bearer {KEY}"}
BIG = 20 << 20  # a 20 MB body


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Process:
    """`corps serve` on the tiny model in a process of its own."""

    def __init__(self, model_dir, *flags: str) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        port = self.url.rsplit(":", 1)[1]
        cmd = [sys.executable, "-c", "from corps.cli.app import app; app()", "serve",
               "-m", str(model_dir), "--dtype", "float32", "--port", port, "--api-key", KEY,
               *flags]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.http = httpx.Client(timeout=120)
        ready = threading.Event()
        for _ in range(1200):  # the engine opens in a few seconds: wait for it (bounded)
            if self.proc.poll() is not None:
                raise RuntimeError(self.proc.stdout.read().decode()[-2000:])
            try:
                if self.http.get(self.url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                ready.wait(0.1)

    def metric(self, name: str) -> float:
        text = self.http.get(self.url + "/metrics").text
        return float(next(x for x in text.splitlines() if x.startswith(name + " ")).split()[1])

    def settled(self) -> None:
        """Wait (bounded) until the engine's loop has no call: cancelled streams' calls
        are aborted at its next step, just after their responses end."""
        pause = threading.Event()
        for _ in range(1000):
            if self.metric("corps_running_calls") == 0 and self.metric("corps_queue_depth") == 0:
                return
            pause.wait(0.01)

    def rss(self) -> int:
        return psutil.Process(self.proc.pid).memory_info().rss

    def close(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(120)


@pytest.fixture(scope="module")
def process(tiny_dirs):
    p = Process(tiny_dirs["llama"], "--keep-messages", "0", "--max-body", str(1 << 20))
    yield p
    p.close()


def big_post(url: str, size: int = BIG, chunked: bool = False) -> int:
    body = b'{"messages": [{"role": "user", "content": "' + b"x" * size + b'"}]}'
    content = iter([body[i : i + (1 << 16)] for i in range(0, len(body), 1 << 16)]) if (
        chunked) else body  # fmt: skip
    try:
        r = httpx.post(url + "/v1/chat/completions", content=content, headers=AUTH, timeout=120)
    except httpx.TransportError:  # the server refused and closed before reading it all
        return 413
    assert r.json()["error"]["message"].startswith("the request body is over the limit")
    return r.status_code


def test_twenty_large_bodies_are_refused_without_holding_them(process):
    """Each 20 MB body gets 413 from its Content-Length (or, chunked, as soon as it passes
    the limit); the server's RSS afterwards is within 10% of before."""
    warm = {"messages": [{"role": "user", "content": "warm"}], "max_tokens": 2}
    process.http.post(process.url + "/v1/chat/completions", headers=AUTH, json=warm)
    before = process.rss()
    assert [big_post(process.url) for _ in range(18)] == [413] * 18
    assert [big_post(process.url, chunked=True) for _ in range(2)] == [413] * 2
    after = process.rss()
    assert after < before * 1.10, (before, after)


def test_sixty_four_streams_half_cut_and_a_burst_of_large_bodies(process):
    """The store is back where it was (the server keeps no message here), every stream
    that was not cut ends with [DONE], /health and /metrics answer throughout."""
    process.settled()
    used = process.metric("corps_store_used_tokens")
    watching, answers = threading.Event(), []

    def watch():
        with httpx.Client(timeout=60) as c:
            while not watching.is_set():
                answers.append(c.get(process.url + "/health").status_code)
                answers.append(c.get(process.url + "/metrics").status_code)

    def stream(i: int) -> str:
        body = {"messages": [{"role": "user", "content": f"count to {i}"}], "max_tokens": 24,
                "temperature": 0.7, "seed": i, "stream": True}  # fmt: skip
        with (
            httpx.Client(timeout=120) as c,
            c.stream("POST", process.url + "/v1/chat/completions", json=body, headers=AUTH) as r,
        ):
            assert r.status_code == 200
            lines = r.iter_lines()
            if i % 2:
                next(lines)
                return "cut"
            return [x for x in lines if x][-1]

    watcher = threading.Thread(target=watch)
    watcher.start()
    with concurrent.futures.ThreadPoolExecutor(72) as pool:
        streams = [pool.submit(stream, i) for i in range(64)]
        bodies = [pool.submit(big_post, process.url) for _ in range(8)]
        got = [f.result() for f in streams]
        assert [f.result() for f in bodies] == [413] * 8
    watching.set()
    watcher.join()
    assert got[1::2] == ["cut"] * 32 and got[::2] == ["data: [DONE]"] * 32
    assert answers and set(answers) == {200}
    process.settled()
    assert process.metric("corps_store_used_tokens") == used
    assert process.metric("corps_http_requests_inside") == 0


def test_sigterm_under_load_exits_within_its_grace(tiny_dirs):
    """Streams still running when SIGTERM comes are given the grace, then cancelled;
    the process exits and each client sees its stream end."""
    p = Process(tiny_dirs["llama"], "--shutdown-grace", "1")
    started = threading.Barrier(9)

    def stream(i: int) -> str:
        body = {"messages": [{"role": "user", "content": f"go {i}"}], "max_tokens": 1000,
                "stream": True, "temperature": 1.0, "seed": i}  # fmt: skip
        try:
            with (
                httpx.Client(timeout=120) as c,
                c.stream("POST", p.url + "/v1/chat/completions", json=body, headers=AUTH) as r,
            ):
                lines = r.iter_lines()
                next(lines)
                started.wait()
                return [x for x in lines if x][-1] if r.status_code == 200 else str(r.status_code)
        except httpx.TransportError:
            return "closed"

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        ends = [pool.submit(stream, i) for i in range(8)]
        started.wait()
        rc = p.close()
        results = [f.result() for f in ends]
    assert rc in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once it has shut down
    assert all(r in ("closed", "data: [DONE]") or r.startswith("data: ") for r in results), results


# ---- in-process: the queue and the deadline ----


@pytest.fixture
def parked(tiny_dirs, monkeypatch):
    """A server whose decodes wait until `release` is set (max_queue 1, deadline 2 s)."""
    release = threading.Event()
    opened = Engine.open(str(tiny_dirs["llama"]), dtype="float32", capacity=2048)
    limits = Limits(max_queue=1, timeout_s=2.0)
    with BackgroundServer(opened, model="tiny", api_key=KEY, limits=limits) as s:
        park_decodes(s.engine, monkeypatch, release)
        yield s, release
        release.set()


def test_a_full_server_answers_429_with_retry_after(parked):
    served, release = parked
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    url = served.url + "/v1/chat/completions"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = pool.submit(httpx.post, url, json=body, headers=AUTH, timeout=60)
        pause = threading.Event()
        for _ in range(1000):  # until the first is inside (bounded)
            if served.app.state.gate.inside:
                break
            pause.wait(0.01)
        second = httpx.post(url, json=body, headers=AUTH, timeout=60)
        assert second.status_code == 429 and second.headers["retry-after"] == "1"
        assert second.json()["error"]["type"] == "rate_limit_error"
        release.set()
        assert first.result().status_code == 200


def test_a_request_past_its_deadline_is_503_and_leaves_nothing(parked):
    served, _ = parked  # never released: the decode waits past the 2 s deadline
    before = served.engine.stats().tokens_used
    body = {"messages": [{"role": "user", "content": "a new message"}], "max_tokens": 2}
    r = httpx.post(served.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=60)
    assert r.status_code == 503 and "deadline" in r.json()["error"]["message"]
    assert served.engine.stats().tokens_used == before
    assert json.loads(r.text)["error"]["type"] == "server_error"
