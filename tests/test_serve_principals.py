"""serve/principals.py and the privacy it gives `corps serve`: three principals (two
tenants; two agents in one) against a real uvicorn server on a free port, with the
official `openai` client and raw HTTP. No route reads a private message of another
agent or tenant, ids cannot be walked, cache hits do not cross tenants, and no
refusal carries a byte of the protected message."""

from __future__ import annotations

import warnings

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from corps.cache.visibility import LeakWarning  # noqa: E402
from corps.engine.api.engine import Engine  # noqa: E402
from corps.serve.background import BackgroundServer  # noqa: E402
from corps.serve.principals import Keys  # noqa: E402

SECRET = "The vault code is 4417-swordfish."
PROTECTED = ("4417", "swordfish", "vault")
KEYS = """
[[keys]]
key = "sk-alice-0001"
tenant = "team-a"
agents = ["alice"]

[[keys]]
key = "sk-bob-00001"
tenant = "team-a"
agents = ["bob"]

[[keys]]
key = "sk-carol-001"
tenant = "team-b"
"""


@pytest.fixture(scope="module")
def keyfile(tmp_path_factory):
    path = tmp_path_factory.mktemp("keys") / "keys.toml"
    path.write_text(KEYS)
    return path


class Tenants(BackgroundServer):
    def __init__(self, model_dir, keyfile, mode: str = "choreographed") -> None:
        opened = Engine.open(str(model_dir), dtype="float32", capacity=4096, mode=mode)
        super().__init__(opened, model="tiny", keys=Keys.load(keyfile))

    def client(self, key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0)

    def post(self, key: str, body: dict, path: str = "/v1/chat/completions") -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"}
        return httpx.post(self.url + path, json=body, headers=headers, timeout=60)


@pytest.fixture(scope="module")
def served(tiny_dirs, keyfile):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LeakWarning)
        with Tenants(tiny_dirs["llama"], keyfile) as s:
            yield s


def chat(client, messages, agent=None, **kw):
    kw.setdefault("max_tokens", 4)
    kw.setdefault("temperature", 0)
    extra = {"corps_agent": agent} if agent else None
    return client.chat.completions.create(model="tiny", messages=messages, extra_body=extra, **kw)


@pytest.fixture(scope="module")
def alice_secret(served):
    """Alice's private secret, then a public question of hers that attends to it."""
    r = chat(served.client("sk-alice-0001"), [
        {"role": "user", "content": SECRET, "corps_visibility": "private"},
        {"role": "user", "content": "What should I do today?"},
    ], agent="alice")  # fmt: skip
    secret, question = r.model_extra["corps"]["prompt"]
    return secret, question


def by_id(mid: str, **extra) -> list[dict]:
    return [{"role": "user", "corps_message_id": mid, **extra}]


def assert_quotes_nothing(body: str) -> None:
    assert not any(p in body for p in PROTECTED), body


def test_the_owner_reads_her_private_message_by_id(served, alice_secret):
    secret, _ = alice_secret
    r = chat(served.client("sk-alice-0001"), by_id(secret), agent="alice")
    assert r.usage.prompt_tokens_details.cached_tokens == r.usage.prompt_tokens


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("key", "agent", "status"),
    [
        ("sk-bob-00001", "bob", 403),  # another agent of the tenant
        ("sk-alice-0001", None, 403),  # her own key, naming no agent: not alice
        ("sk-carol-001", None, 404),  # another tenant: not even confirmed to exist
        ("sk-carol-001", "alice", 404),  # ... whatever agent it claims
    ],
)
def test_no_one_else_reads_a_private_message_by_id(
    served, alice_secret, key, agent, status, stream
):
    """Chat by id, streamed or not, with n=3: refused with the same status, before any
    stream starts, in words that quote nothing; the store is as it was."""
    secret, _ = alice_secret
    before = served.engine.stats()
    for n in (1, 3) if not stream else (1,):
        body = {"model": "tiny", "messages": by_id(secret), "max_tokens": 4, "n": n,
                "stream": stream, **({"corps_agent": agent} if agent else {})}  # fmt: skip
        r = served.post(key, body)
        assert r.status_code == status and r.headers["content-type"] == "application/json"
        assert r.json()["error"]["type"] in ("permission_error", "not_found_error")
        assert_quotes_nothing(r.text)
    after = served.engine.stats()
    assert (after.tokens_used, after.messages) == (before.tokens_used, before.messages)


def test_a_key_acts_only_as_its_agents(served):
    r = served.post("sk-alice-0001", {"messages": [{"role": "user", "content": "hi"}],
                                      "corps_agent": "bob"})  # fmt: skip
    assert r.status_code == 403 and "may not act as agent 'bob'" in r.json()["error"]["message"]
    assert served.post("sk-nobody-01", {"messages": []}).status_code == 401


def test_another_tenant_gets_404_for_a_real_id_as_for_a_made_up_one(served, alice_secret):
    """Even a public message of team-a: ids are scoped to their tenant, and a real one
    answers exactly as a made-up one (nothing to enumerate by)."""
    _, question = alice_secret
    carol = "sk-carol-001"
    real = served.post(carol, {"messages": by_id(question), "max_tokens": 2})
    made_up = served.post(carol, {"messages": by_id("msg_" + "f" * 32), "max_tokens": 2})
    assert real.status_code == made_up.status_code == 404
    assert real.json() == made_up.json()


def test_ids_are_opaque_and_unrelated(served):
    client = served.client("sk-carol-001")
    ids = [chat(client, [{"role": "user", "content": f"n{i}"}]).model_extra["corps"]["prompt"][0]
           for i in range(3)]  # fmt: skip
    assert len(set(ids)) == 3 and all(len(i) == 36 and i.startswith("msg_") for i in ids)
    assert len({i[4:12] for i in ids}) == 3  # no shared prefix to count up from


def test_resent_text_finds_nothing_of_another_agent_or_tenant(served, alice_secret):
    """Bob (same tenant) and Carol (another) resend Alice's exact messages: each gets an
    encoding of its own, and cached_tokens 0: no hit reveals what she sent."""
    secret, _ = alice_secret
    for key, agent in (("sk-bob-00001", "bob"), ("sk-carol-001", None), ("sk-carol-001", "alice")):
        r = chat(served.client(key), [
            {"role": "user", "content": SECRET, "corps_visibility": "private"},
            {"role": "user", "content": "What should I do today?"},
        ], agent=agent)  # fmt: skip
        assert r.usage.prompt_tokens_details.cached_tokens == 0
        assert secret not in r.model_extra["corps"]["prompt"]


def test_a_leak_under_warn_is_reported_to_the_caller_and_counted(served, alice_secret):
    """Bob may read Alice's public question, whose encoding attended to her secret: the
    default policy lets it run and says so in the response and in /metrics."""
    _, question = alice_secret
    r = chat(served.client("sk-bob-00001"), by_id(question), agent="bob")
    assert r.model_extra["corps"]["leaks"] >= 1
    metrics = httpx.get(served.url + "/metrics").text
    leaks = next(line for line in metrics.splitlines() if line.startswith("corps_leaks_total"))
    assert int(leaks.split()[-1]) >= 1
    assert_quotes_nothing(metrics)
    clean = chat(served.client("sk-carol-001"), [{"role": "user", "content": "hello"}])
    assert clean.model_extra["corps"]["leaks"] == 0


def test_completions_are_tenant_scoped_too(served):
    """The legacy endpoint has no ids; what it could reveal is a cache hit (baseline) and
    its replies' ids, which another tenant cannot use."""
    r = served.client("sk-alice-0001").completions.create(model="tiny", prompt=SECRET,
                                                          max_tokens=2)  # fmt: skip
    rid = r.choices[0].model_extra["corps"]["id"]
    assert served.post("sk-carol-001", {"messages": by_id(rid)}).status_code == 404


def test_in_baseline_mode_no_cache_hit_crosses_tenants(tiny_dirs, keyfile):
    """The radix cache is salted per tenant: Carol resending Alice's conversation finds 0
    cached tokens; Alice resending it finds her own prefix."""
    with Tenants(tiny_dirs["llama"], keyfile, mode="baseline") as served:
        conv = [{"role": "system", "content": "you keep secrets"},
                {"role": "user", "content": SECRET}]  # fmt: skip
        chat(served.client("sk-alice-0001"), conv, agent="alice")
        carol = chat(served.client("sk-carol-001"), conv)
        again = chat(served.client("sk-alice-0001"), conv, agent="alice")
        assert carol.usage.prompt_tokens_details.cached_tokens == 0
        assert again.usage.prompt_tokens_details.cached_tokens > 0


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "needs one or more [[keys]]"),
        ('[[keys]]\nkey = "short"\ntenant = "a"', "8 or more"),
        ('[[keys]]\nkey = "sk-12345678"\ntenant = "a/b"', "tenant must match"),
        ('[[keys]]\nkey = "sk-12345678"\ntenant = "a"\nagents = ["x y"]', "agents must be"),
        ('[[keys]]\nkey = "sk-12345678"\ntenant = "a"\nrole = "admin"', "unknown field"),
        (
            '[[keys]]\nkey = "sk-12345678"\ntenant = "a"\n[[keys]]\nkey = "sk-12345678"\n'
            'tenant = "b"',
            "repeats",
        ),
        ("[[keys]\n", "keys.toml"),
        ('[[keys]]\ntenant = "a"', "one of key or key_sha256"),
        ('[[keys]]\nkey_sha256 = "abc"\ntenant = "a"', "64 hexadecimal"),
    ],
)
def test_a_bad_key_file_says_what_is_wrong(tmp_path, text, says):
    path = tmp_path / "keys.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=f".*{says.replace('[', '.').replace(']', '.')}"):
        Keys.load(path)


def test_a_key_file_may_hold_only_the_keys_digests(tmp_path):
    import hashlib

    digest = hashlib.sha256(b"sk-hashed-key-1").hexdigest()
    path = tmp_path / "keys.toml"
    path.write_text(f'[[keys]]\nkey_sha256 = "{digest}"\ntenant = "t"\nagents = ["a"]\n')
    keys = Keys.load(path)
    assert keys.principal("Bearer sk-hashed-key-1").tenant == "t"
    assert keys.principal("Bearer " + digest) is None  # the digest is not the key


def test_keys_authenticate_their_principal_only():
    keys = Keys.single("sk-local-key")
    assert keys.principal("Bearer sk-local-key").tenant == "default"
    assert keys.principal("Bearer sk-local-kez") is None
    assert keys.principal("sk-local-key") is None and keys.principal("") is None
    assert Keys(None).principal("").tenant == "local"  # no key configured: local use
