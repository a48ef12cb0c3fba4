"""`corps serve` (serve/): the official `openai` client against a tiny model served
on a free loopback port in this process (float32, so greedy replies are exact)."""

from __future__ import annotations

import json
import sys

import jsonschema
import pytest

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")

from corps.engine.api.engine import Engine  # noqa: E402
from corps.serve.background import BackgroundServer  # noqa: E402

KEY = "sk-test"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
NOTHING = {"type": "object", "properties": {}, "additionalProperties": False}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": NOTHING}}


class Served(BackgroundServer):
    """The tiny model served (float32, leak policy deny, the test key)."""

    def __init__(self, model_dir, mode: str = "choreographed", **engine) -> None:
        opened = Engine.open(
            str(model_dir), dtype="float32", capacity=4096, leak_policy="deny", mode=mode,
            **engine,
        )  # fmt: skip
        super().__init__(opened, model="tiny", api_key=KEY)

    def client(self, key: str = KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0)


@pytest.fixture(scope="module")
def served(tiny_dirs):
    with Served(tiny_dirs["llama"]) as s:
        yield s


@pytest.fixture
def client(served):
    return served.client()


def ask(client, content="hello world", **kw):
    kw.setdefault("max_tokens", 8)
    kw.setdefault("temperature", 0.0)
    return client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": content}], **kw
    )


def test_a_chat_reply_with_usage_and_its_message_id(client):
    r = ask(client)
    choice = r.choices[0]
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.completion_tokens > 0 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    mid = choice.message.model_extra["corps"]["id"]
    assert mid.startswith("msg_") and len(mid) == 36  # opaque: 128 random bits


def test_greedy_replies_are_the_same_streamed_or_not_and_usage_comes_last(client):
    whole = ask(client, "the quick brown fox", max_tokens=12).choices[0].message.content
    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "the quick brown fox"}],
            max_tokens=12, temperature=0.0, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")


def test_n_choices_each_their_own(client):
    r = ask(client, n=3, temperature=1.0, seed=7, max_tokens=6)
    assert [c.index for c in r.choices] == [0, 1, 2]
    ids = {c.message.model_extra["corps"]["id"] for c in r.choices}
    assert len(ids) == 3


def test_a_json_schema_reply_validates(client):
    schema = {
        "type": "object",
        "properties": {
            "answer": {"type": "integer", "minimum": 0, "maximum": 99},
            "why": {"type": "string", "maxLength": 8},
        },
        "required": ["answer", "why"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": True}}
    r = ask(client, "what is 7 times 6?", response_format=fmt, max_tokens=200)
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    # any object: the random tiny model writes keys until its budget cuts them
    r = ask(client, "json please", response_format={"type": "json_object"}, max_tokens=24)
    text, finish = r.choices[0].message.content, r.choices[0].finish_reason
    assert text.startswith("{")
    assert finish == "length" or isinstance(json.loads(text), dict)


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_forced_tool_calls_parse_and_name_a_given_tool(client, choice):
    r = ask(client, "weather in Paris?", tools=[WEATHER, CLOCK], tool_choice=choice,
            max_tokens=120, parallel_tool_calls=False)  # fmt: skip
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    (call,) = c.message.tool_calls
    assert call.function.name in ("get_weather", "get_time")
    if isinstance(choice, dict):
        assert call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])


def test_logprobs_one_per_generated_token_with_the_most_likely_beside(client):
    r = ask(client, logprobs=True, top_logprobs=3, max_tokens=6)
    lp = r.choices[0].logprobs.content
    assert len(lp) == r.usage.completion_tokens
    for x in lp:
        assert x.logprob <= 0 and len(x.top_logprobs) == 3
        tops = [t.logprob for t in x.top_logprobs]
        assert tops == sorted(tops, reverse=True) and x.logprob <= tops[0] + 1e-5
        assert x.top_logprobs[0].token == x.token  # greedy: the token is the most likely
    with pytest.raises(openai.BadRequestError, match="logprobs"):
        ask(client, top_logprobs=2)


def test_errors_are_openai_exceptions_with_their_status(served, client):
    with pytest.raises(openai.NotFoundError, match="not served here"):
        client.chat.completions.create(model="gpt-5", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="temperature"):
        ask(client, temperature="hot")
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}
    with pytest.raises(openai.BadRequestError):  # a schema llguidance cannot compile
        ask(client, response_format=bad)
    with pytest.raises(openai.NotFoundError, match="no such message"):
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "corps_message_id": "msg_" + "0" * 32}]
        )
    with pytest.raises(openai.AuthenticationError):
        ask(served.client("wrong"))
    before = served.engine.stats().tokens_used
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        ask(client, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "x"}})
    assert served.engine.stats().tokens_used == before  # refused before anything ran


def test_a_message_by_id_gives_the_tokens_its_text_gives(client):
    """The extension, chain case: the question named by id (not resent) gives the same
    greedy reply as its text resent, and is counted as cached."""
    first = ask(client, "what is seven times six", max_tokens=10)
    qid = first.model_extra["corps"]["prompt"][-1]
    by_id = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "corps_message_id": qid}], max_tokens=10,
        temperature=0.0,
    )  # fmt: skip
    assert by_id.choices[0].message.content == first.choices[0].message.content
    assert by_id.usage.prompt_tokens_details.cached_tokens == by_id.usage.prompt_tokens


def test_a_resent_conversation_reuses_its_messages_and_the_reply(client):
    conv = [{"role": "system", "content": "you are terse"},
            {"role": "user", "content": "hello world"}]  # fmt: skip
    r1 = client.chat.completions.create(model="tiny", messages=conv, max_tokens=6, temperature=0)
    reply = {"role": "assistant", "content": r1.choices[0].message.content}
    more = [*conv, reply, {"role": "user", "content": "and then?"}]
    r2 = client.chat.completions.create(model="tiny", messages=more, max_tokens=6, temperature=0)
    ids = r2.model_extra["corps"]["prompt"]
    assert ids[:2] == r1.model_extra["corps"]["prompt"]
    assert ids[2] == r1.choices[0].message.model_extra["corps"]["id"]  # the reply itself
    cached = r2.usage.prompt_tokens_details.cached_tokens
    assert r1.usage.prompt_tokens < cached < r2.usage.prompt_tokens


def test_a_private_message_of_another_agent_is_refused_under_deny(client):
    r = client.chat.completions.create(
        model="tiny", max_tokens=4, temperature=0,
        messages=[{"role": "user", "content": "my secret", "corps_visibility": "private"}],
        extra_body={"corps_agent": "alice"},
    )  # fmt: skip
    secret = r.model_extra["corps"]["prompt"][-1]
    with pytest.raises(openai.PermissionDeniedError):
        client.chat.completions.create(
            model="tiny", max_tokens=4, messages=[{"role": "user", "corps_message_id": secret}],
            extra_body={"corps_agent": "bob"},
        )  # fmt: skip


def test_completions_models_health_and_metrics(served, client):
    r = client.completions.create(model="tiny", prompt="the quick", max_tokens=5, temperature=0)
    assert r.choices[0].text is not None and r.usage.completion_tokens > 0
    assert [m.id for m in client.models.list()] == ["tiny"]
    from urllib.request import urlopen

    assert json.loads(urlopen(served.url + "/health").read()) == {"status": "ok"}
    metrics = urlopen(served.url + "/metrics").read().decode()
    assert "corps_http_requests_total" in metrics and "corps_store_used_tokens" in metrics
    assert "corps_tokens_copied_back_total" in metrics  # the store tier's, 0 without one


def test_metrics_give_the_audit_by_repair_policy_and_no_client_name(tiny_dirs):
    """With --audit 1, a conversation's second turn (it reads the first's messages) is
    audited; /metrics counts it and gives its gap under the policy's label only."""
    import threading
    from urllib.request import urlopen

    audited = threading.Event()
    with Served(tiny_dirs["llama"], audit=1, audit_budget=1.0) as s:
        s.engine.recorder.add(lambda e: audited.set() if e.type == "audited" else None)
        client = s.client()
        first = ask(client, "remember the number 7", extra_body={"corps_agent": "alice"})
        ids = first.model_extra["corps"]["prompt"] + [
            first.choices[0].message.model_extra["corps"]["id"]
        ]
        client.chat.completions.create(
            model="tiny", max_tokens=4, temperature=0,
            messages=[{"role": "user", "corps_message_id": i} for i in ids]
            + [{"role": "user", "content": "which number?"}],
            extra_body={"corps_agent": "alice"},
        )  # fmt: skip
        assert audited.wait(120)  # the second turn's shadow ran (a trace event says so)
        metrics = urlopen(s.url + "/metrics").read().decode()
    assert "corps_audited_calls_total" in metrics and 'corps_audit_gap{repair="none"}' in metrics
    assert "alice" not in metrics and "remember" not in metrics


def test_streams_cut_mid_way_cancel_and_give_back_what_they_held(served):
    """32 concurrent streams, every other one closed after its first chunk: the others
    finish, and besides what the message cache keeps (the prompts and the finished
    replies) the store holds what it held before; the bookkeeping is exact."""
    import concurrent.futures

    client, engine, cache = served.client(), served.engine, served.app.state.cache
    before = engine.stats().tokens_used - cache.tokens()

    def one(i: int) -> str:
        stream = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": f"count to {i}"}],
            max_tokens=24, temperature=0.7, seed=i, stream=True,
        )  # fmt: skip
        if i % 2:
            next(iter(stream))
            stream.close()
            return "cut"
        return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        got = list(pool.map(one, range(32)))
    assert got[1::2] == ["cut"] * 16 and all(isinstance(t, str) for t in got[::2])
    for _ in range(100):  # each request is a step of the loop, which reaps cancelled calls
        stats = engine.stats()
        if stats.running == 0 and stats.queue_depth == 0:
            break
        ask(client, max_tokens=1)
    assert engine.stats().tokens_used - cache.tokens() == before
    engine.check()


def test_the_example_choreographs_a_tree_of_thoughts_by_id(client):
    """examples/serve_openai.py: the votes read the question and the proposals from the
    store; only the ballot's own question is encoded for them."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parent.parent / "examples" / "serve_openai.py"
    spec = importlib.util.spec_from_file_location("examples_serve_openai", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = module.tree_of_thoughts(client, "tiny", branches=3, voters=2)
    assert len(out["proposals"]) == 3 and len(out["votes"]) == 2
    assert all(json.loads(v)["best"] in ("1", "2", "3") for v in out["votes"])
    assert 0 < out["cached_tokens"] < out["prompt_tokens"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--mode", "hf"], "choreographed or baseline"),
        (["--policy", "x"], "policy"),
        (["--keys", "/nonexistent/keys.toml"], "--keys"),
        (["--keys", __file__], "--keys"),  # not TOML
        (["--keys", __file__, "--api-key", "sk-12345678"], "give one"),
        (["--max-body", "10"], "max-body"),
        (["--max-queue", "0"], "max-queue"),
    ],
)
def test_corps_serve_refuses_bad_settings_before_loading(args, says):
    from typer.testing import CliRunner

    from corps.cli.app import app

    result = CliRunner().invoke(app, ["serve", *args], env={"COLUMNS": "200"})
    assert result.exit_code == 2 and says in result.output


def test_a_langgraph_agent_runs_unchanged_and_its_resent_text_is_reused(served):
    """examples/serve_langgraph.py: LangChain's ChatOpenAI in a LangGraph graph, pointed
    at the server; each call resends the conversation, which the server finds."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parent.parent / "examples" / "serve_langgraph.py"
    spec = importlib.util.spec_from_file_location("examples_serve_langgraph", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["examples_serve_langgraph"] = module  # LangGraph reads its State's hints
    spec.loader.exec_module(module)
    cached = served.app.state.metrics.cached_tokens
    messages = module.run(served.url + "/v1", "tiny", api_key=KEY, max_tokens=8)
    kinds = [type(m).__name__ for m in messages]
    assert kinds == ["HumanMessage", "AIMessage", "HumanMessage", "AIMessage"]
    assert all(isinstance(m.content, str) for m in messages)
    assert served.app.state.metrics.cached_tokens > cached  # the resent turns were found


def test_concurrent_requests_with_the_same_new_message_encode_it_once(client):
    import concurrent.futures

    def one(i: int):
        return ask(client, "a message nobody sent before", max_tokens=3, seed=i, temperature=1)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(one, range(4)))
    prompts = {tuple(r.model_extra["corps"]["prompt"]) for r in replies}
    assert len(prompts) == 1  # one encoding, read by all four
    cached = sorted(r.usage.prompt_tokens_details.cached_tokens for r in replies)
    assert cached[0] == 0 and cached[1:] == [replies[0].usage.prompt_tokens] * 3


def test_in_baseline_mode_cached_tokens_are_the_radix_cache_s(tiny_dirs):
    """Baseline messages hold text only: what a resent conversation finds cached is the
    prefix of its rendered prompt the radix cache holds."""
    with Served(tiny_dirs["llama"], mode="baseline") as served:
        client = served.client()
        conv = [{"role": "system", "content": "you are terse"},
                {"role": "user", "content": "hello world"}]  # fmt: skip
        first = client.chat.completions.create(model="tiny", messages=conv, max_tokens=4,
                                               temperature=0)  # fmt: skip
        more = [*conv, {"role": "user", "content": "and then?"}]
        again = client.chat.completions.create(model="tiny", messages=more, max_tokens=4,
                                               temperature=0)  # fmt: skip
        cached = again.usage.prompt_tokens_details.cached_tokens
        assert first.usage.prompt_tokens_details.cached_tokens == 0
        assert 0 < cached < again.usage.prompt_tokens


TWO_TENANTS = ('[[keys]]\nkey = "sk-team-a-1"\ntenant = "a"\nweight = 2\n\n'
               '[[keys]]\nkey = "sk-team-b-1"\ntenant = "b"\n')  # fmt: skip


@pytest.mark.parametrize(("policy", "chosen"), [(None, "fair"), ("fair", "fair")])
def test_a_key_file_of_two_tenants_serves_them_fairly(tmp_path, monkeypatch, policy, chosen):
    import uvicorn
    from typer.testing import CliRunner

    import corps.serve.app
    from corps.cli.app import app
    from corps.engine import Engine

    keys = tmp_path / "keys.toml"
    keys.write_text(TWO_TENANTS)
    seen = {}
    monkeypatch.setattr(Engine, "open", classmethod(lambda cls, cfg: seen.setdefault("cfg", cfg)))
    monkeypatch.setattr(corps.serve.app, "create_app", lambda *a, **kw: seen.setdefault("kw", kw))
    monkeypatch.setattr(uvicorn, "run", lambda *a, **kw: None)
    args = ["serve", "--keys", str(keys), *(["--policy", policy] if policy else [])]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert seen["cfg"].policy == chosen and seen["kw"]["keys"].weights() == {"a": 2.0, "b": 1.0}


def test_corps_serve_refuses_weights_its_policy_would_not_read(tmp_path):
    from typer.testing import CliRunner

    from corps.cli.app import app

    keys = tmp_path / "keys.toml"
    keys.write_text(TWO_TENANTS)
    result = CliRunner().invoke(app, ["serve", "--keys", str(keys), "--policy", "fcfs"],
                                env={"COLUMNS": "200"})  # fmt: skip
    assert result.exit_code == 2 and "only --policy fair" in result.output


def test_with_a_store_ids_outlive_the_server(tiny_dirs, tmp_path):
    """`corps serve --store DIR`: a reply's id, got before a restart, names the same
    message after it (for its tenant), read as it is: the follow-up is the one the
    first server gave, and every message it encoded is found again (all cached)."""
    store = tmp_path / "store"
    conv = [{"role": "user", "content": "what is seven times six"}]
    with Served(tiny_dirs["llama"], store=store) as s:
        first = s.client().chat.completions.create(
            model="tiny", messages=conv, max_tokens=6, temperature=0.0
        )
        ids = [
            *first.model_extra["corps"]["prompt"],
            first.choices[0].message.model_extra["corps"]["id"],
        ]
        again = [
            {"role": r, "corps_message_id": i}
            for r, i in zip(("user", "assistant"), ids, strict=True)
        ]
        want = s.client().chat.completions.create(
            model="tiny", messages=[*again, {"role": "user", "content": "and eight"}],
            max_tokens=6, temperature=0.0,
        )  # fmt: skip
    with Served(tiny_dirs["llama"], store=store) as s:
        got = s.client().chat.completions.create(
            model="tiny", messages=[*again, {"role": "user", "content": "and eight"}],
            max_tokens=6, temperature=0.0,
        )  # fmt: skip
        assert got.choices[0].message.content == want.choices[0].message.content
        # every message of the prompt was encoded by the first server and kept: all cached
        assert got.usage.prompt_tokens_details.cached_tokens == got.usage.prompt_tokens
        with pytest.raises(openai.NotFoundError):  # a guessed id is still no message
            s.client().chat.completions.create(
                model="tiny", max_tokens=2,
                messages=[{"role": "user", "corps_message_id": "msg_" + "0" * 32}],
            )  # fmt: skip
