"""serve/quotas.py: the server's places and each key's quota. The gate on a controlled
clock (requests at once, tokens a minute, Retry-After, the default share of a key on a
shared server), hostile key files refused at start, and a real server where one key
floods: that key gets 429 with Retry-After, the other key's requests all pass, and
the store is exact after. /metrics names tenants only when asked to."""

from __future__ import annotations

import concurrent.futures
import math
import threading

import pytest

from corps.serve.errors import ServeError
from corps.serve.principals import Keys, Principal, Quota
from corps.serve.quotas import WINDOW_S, Gate


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def refused(gate: Gate, p: Principal) -> ServeError:
    before = (gate.inside, {k: v.inside for k, v in gate.held.items()})
    with pytest.raises(ServeError) as info:
        gate.take(p)
    assert info.value.status == 429 and "Retry-After" in info.value.headers
    assert (gate.inside, {k: v.inside for k, v in gate.held.items()}) == before  # unchanged
    return info.value


def test_a_key_holds_at_most_its_max_requests_and_others_still_enter():
    gate = Gate(10, tenants=2)
    a, b = Principal("a", quota=Quota(max_requests=2)), Principal("b")
    gate.take(a)
    gate.take(a)
    assert "this API key holds 2" in refused(gate, a).message
    gate.take(b)
    gate.leave(a)
    gate.take(a)  # a place of its own came back
    assert gate.inside_by_tenant() == {"a": 2, "b": 1}


def test_on_a_shared_server_no_key_fills_every_place():
    gate = Gate(8, tenants=2)
    a, b = Principal("a"), Principal("b")
    for _ in range(6):  # 8 - 8 // 4
        gate.take(a)
    refused(gate, a)
    gate.take(b)
    gate.take(b)
    assert "the server holds 8" in refused(gate, b).message  # the server's own bound
    alone = Gate(8, tenants=1)
    for _ in range(8):
        alone.take(a)  # one tenant: every place is its
    assert Gate(1, tenants=3).per_key == 1


def test_tokens_per_minute_refuse_until_the_oldest_leave_the_window():
    clock = Clock()
    gate = Gate(10, tenants=2, clock=clock)
    a = Principal("a", quota=Quota(tokens_per_minute=100))
    gate.take(a)
    gate.leave(a, 60)
    clock.t += 20
    gate.take(a)
    gate.leave(a, 50)  # 110 in the window now
    err = refused(gate, a)
    assert err.headers["Retry-After"] == str(math.ceil(WINDOW_S - 20))
    clock.t += WINDOW_S - 20  # the first 60 left the window: 50 spent
    gate.take(a)
    gate.leave(a, 0)
    assert gate.held[a].total == 50


KEYS = """
[[keys]]
key = "sk-flooder-01"
tenant = "flood"
max_requests = 2
weight = 1

[[keys]]
key = "sk-quiet-001"
tenant = "quiet"
weight = 3
"""


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ("weight = -1", "weight must be"),
        ("weight = 0", "weight must be"),
        ("weight = nan", "weight must be"),
        ("weight = inf", "weight must be"),
        ("weight = 1e9", "weight must be"),
        ("weight = true", "weight must be"),
        ('weight = "2"', "weight must be"),
        ("max_requests = 0", "max_requests must be"),
        ("max_requests = -3", "max_requests must be"),
        ("max_requests = 2.5", "max_requests must be"),
        ("max_requests = 99999999999999999", "max_requests must be"),
        ("tokens_per_minute = -1", "tokens_per_minute must be"),
        ('tokens_per_minute = "lots"', "tokens_per_minute must be"),
    ],
)
def test_a_hostile_quota_or_weight_is_refused_with_its_field(tmp_path, entry, says):
    path = tmp_path / "keys.toml"
    path.write_text(f'[[keys]]\nkey = "sk-12345678"\ntenant = "a"\n{entry}\n')
    with pytest.raises(ValueError, match=says):
        Keys.load(path)


def test_one_tenant_gets_one_weight(tmp_path):
    path = tmp_path / "keys.toml"
    two = ('[[keys]]\nkey = "sk-12345678"\ntenant = "a"\nweight = 2\n'
           '[[keys]]\nkey = "sk-87654321"\ntenant = "a"\nweight = 3\n')  # fmt: skip
    path.write_text(two)
    with pytest.raises(ValueError, match="two weights"):
        Keys.load(path)
    path.write_text(two.replace("weight = 3", "") + '[[keys]]\nkey = "sk-b-123456"\ntenant = "b"\n')
    keys = Keys.load(path)
    assert keys.weights() == {"a": 2.0, "b": 1.0} and keys.weighted()
    assert keys.principal("Bearer sk-87654321").weight == 2.0  # given on its other key


# ---- a real server: one key floods ----

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from corps.engine.api.engine import Engine  # noqa: E402
from corps.serve.background import BackgroundServer  # noqa: E402
from corps.serve.limits import Limits  # noqa: E402

from helpers import park_decodes  # noqa: E402


@pytest.fixture
def flooded(tiny_dirs, tmp_path, monkeypatch):
    """A fair server whose decodes wait until `release` is set."""
    path = tmp_path / "keys.toml"
    path.write_text(KEYS)
    release = threading.Event()
    opened = Engine.open(str(tiny_dirs["llama"]), dtype="float32", capacity=4096, policy="fair")
    with BackgroundServer(opened, model="tiny", keys=Keys.load(path), limits=Limits(max_queue=8),
                          tenant_metrics=True) as s:  # fmt: skip
        park_decodes(s.engine, monkeypatch, release)
        yield s, release
        release.set()


def post(server, key: str, i: int) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 3,
            "temperature": 0.0}  # fmt: skip
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {key}"})  # fmt: skip


def test_a_flooding_key_gets_429_and_the_others_pass(flooded):
    server, release = flooded
    assert server.engine.stats().policy == "fair"
    before = server.engine.stats().tokens_used
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        flood = [pool.submit(post, server, "sk-flooder-01", i) for i in range(10)]
        gate = server.app.state.gate
        for _ in concurrent.futures.as_completed(flood, timeout=60):  # 8 of 10 refused at once
            if sum(x.done() for x in flood) == 8:
                break
        assert gate.inside_by_tenant().get("flood") == 2
        quiet = [pool.submit(post, server, "sk-quiet-001", i) for i in range(3)]
        release.set()
        flood_codes = sorted(f.result().status_code for f in flood)
        assert [q.result().status_code for q in quiet] == [200, 200, 200]
    assert flood_codes == [200, 200] + [429] * 8
    refusal = next(f.result() for f in flood if f.result().status_code == 429)
    assert refusal.headers["retry-after"] == "1"
    assert refusal.json()["error"]["type"] == "rate_limit_error"
    assert "quiet" not in refusal.text and "question" not in refusal.text
    server.engine.check()  # nothing half-done: the store is exact
    stats = server.engine.stats()
    assert stats.tokens_used >= before and stats.running == 0 and stats.queue_depth == 0
    assert set(stats.tenants) == {"flood", "quiet"}
    assert stats.tenants["quiet"]["weight"] == 3.0
    assert stats.tenants["quiet"]["served"] > 0
    metrics = httpx.get(server.url + "/metrics").text
    assert 'corps_tenant_refused_total{tenant="flood"} 8' in metrics
    assert 'corps_tenant_weight{tenant="quiet"} 3' in metrics
    assert "question" not in metrics  # counters only, never a request's text


def test_without_tenant_metrics_no_tenant_is_named(tiny_dirs, tmp_path):
    path = tmp_path / "keys.toml"
    path.write_text(KEYS)
    opened = Engine.open(str(tiny_dirs["llama"]), dtype="float32", capacity=2048, policy="fair")
    with BackgroundServer(opened, model="tiny", keys=Keys.load(path)) as server:
        assert post(server, "sk-quiet-001", 0).status_code == 200
        metrics = httpx.get(server.url + "/metrics").text
    assert "quiet" not in metrics and "corps_tenant_" not in metrics
