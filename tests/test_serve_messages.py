"""serve/messages.py: the server's kept messages, bounded in count and in the store's
slots (least recently used freed first, never one a request still claims), and a
failed request's new messages freed."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from corps.engine import Engine
from corps.serve.messages import MessageCache

httpx = pytest.importorskip("httpx")


async def test_kept_messages_stay_within_their_share_of_the_store():
    async with Engine.open("dummy:tiny") as engine:
        cache = MessageCache(engine, size=1000, tokens=60)
        handles = []
        for i in range(12):
            h, found = await cache.encode("user", f"message number {i} " * 3, [], [None],
                                          "t/", "t")  # fmt: skip
            assert not found
            cache.release([h], ok=True)
            handles.append(h)
            assert cache.tokens() <= 60
        assert handles[0].freed and not handles[-1].freed  # least recently used went first
        claimed, _ = await cache.encode("user", "held by a request " * 20, [], [None], "t/", "t")
        assert not claimed.freed and cache.tokens() > 60  # claimed: kept past the bound
        cache.release([claimed], ok=True)
        assert cache.tokens() <= 60
        engine.check()


async def test_a_failed_requests_new_message_is_freed_and_counted_out():
    async with Engine.open("dummy:tiny") as engine:
        cache = MessageCache(engine, size=10, tokens=10_000)
        h, _ = await cache.encode("user", "a prompt that fails", [], [None], "t/", "t")
        assert cache.tokens() == h.length
        cache.release([h], ok=False)
        assert h.freed and cache.tokens() == 0 and len(cache) == 0
        engine.check()


async def test_with_a_store_ids_come_back_for_their_tenant_only(tmp_path):
    """A server's kept messages outlive it on a store: each id names its message
    again, for its tenant alone, and is found again by content; a request that never
    succeeded leaves nothing behind."""
    store = tmp_path / "store"
    async with Engine.open("dummy:tiny", store=store) as engine:
        cache = MessageCache(engine, size=10, tokens=10_000)
        a, _ = await cache.encode("user", "tenant a's prompt", [], [None], "a/", "a")
        b, _ = await cache.encode("user", "tenant b's prompt", [], [None], "b/", "b")
        lost, _ = await cache.encode("user", "a prompt that fails", [], [None], "a/", "a")
        cache.release([a, b], ok=True)
        ids = cache.public_id(a), cache.public_id(b)
        cache.close()  # the server stops, its request still claiming `lost`
        assert lost.freed and not a.freed
    async with Engine.open("dummy:tiny", store=store) as engine:
        cache = MessageCache(engine, size=10, tokens=10_000)
        assert cache.restore() == 2
        assert cache.find("a", ids[0]).id == a.id and cache.find("b", ids[1]).id == b.id
        assert cache.find("b", ids[0]) is None and cache.find("a", ids[1]) is None
        again, found = await cache.encode("user", "tenant a's prompt", [], [None], "a/", "a")
        assert found and again.id == a.id
        engine.check()


KEYS = """
[[keys]]
key = "sk-team-a-0001"
tenant = "team-a"

[[keys]]
key = "sk-team-b-0001"
tenant = "team-b"
"""


class Served:
    """`corps serve --store` on the tiny model in a process of its own."""

    def __init__(self, model_dir: Path, keys: Path, store: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url, self.model = f"http://127.0.0.1:{port}", str(model_dir)
        cmd = [sys.executable, "-c", "from corps.cli.app import app; app()", "serve", "-m",
               str(model_dir), "--dtype", "float32", "--port", str(port), "--keys", str(keys),
               "--store", str(store)]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        pause = threading.Event()
        for _ in range(1200):  # the engine opens in a few seconds: wait for it (bounded)
            if self.proc.poll() is not None:
                raise RuntimeError(self.proc.stdout.read().decode()[-2000:])
            try:
                if httpx.get(self.url + "/health").status_code == 200:
                    return
            except httpx.TransportError:
                pause.wait(0.1)

    def ask(self, key: str, messages: list[dict]) -> httpx.Response:
        body = {"model": self.model, "messages": messages, "max_tokens": 6, "temperature": 0.0}
        auth = {"Authorization": f"Bearer {key}"}
        return httpx.post(self.url + "/v1/chat/completions", json=body, headers=auth, timeout=120)


def test_a_killed_server_on_a_store_answers_every_id_it_gave(tiny_dirs, tmp_path):
    """`corps serve --store` killed with SIGKILL while requests run, then restarted:
    every id a client got a 200 for names its message again for its tenant, and for
    the other tenant is no message at all."""
    keys = tmp_path / "keys.toml"
    keys.write_text(KEYS)
    a, b = "sk-team-a-0001", "sk-team-b-0001"
    first = Served(tiny_dirs["llama"], keys, tmp_path / "store")
    got: list[str] = []
    done = threading.Event()

    def client(i: int) -> None:
        for j in range(50):
            try:
                r = first.ask(a, [{"role": "user", "content": f"question {i}.{j}"}])
            except httpx.TransportError:
                return  # the server died under it
            if r.status_code == 200:
                body = r.json()
                got.extend([*body["corps"]["prompt"], body["choices"][0]["message"]["corps"]["id"]])
                if len(got) >= 12:
                    done.set()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    assert done.wait(300), "no replies before the kill"
    first.proc.send_signal(signal.SIGKILL)  # under load: requests in flight
    first.proc.wait(60)
    for t in threads:
        t.join(120)
    again = Served(tiny_dirs["llama"], keys, tmp_path / "store")
    try:
        for mid in got:
            mine = again.ask(a, [{"role": "user", "corps_message_id": mid}])
            assert mine.status_code == 200, (mid, mine.text)
            theirs = again.ask(b, [{"role": "user", "corps_message_id": mid}])
            assert theirs.status_code == 404, (mid, theirs.text)
    finally:
        again.proc.send_signal(signal.SIGTERM)
        again.proc.wait(120)
