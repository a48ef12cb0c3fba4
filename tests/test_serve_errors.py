"""serve/errors.py: every failure of `corps serve` is an OpenAI error object with the
right status, never a 500 or a broken stream, and a refused request leaves the store
and the message table exactly as they were. Raw HTTP and the `openai` client against
a real uvicorn server on a free port (tiny model, float32, leak policy deny)."""

from __future__ import annotations

import json
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from corps.engine.api.engine import Engine  # noqa: E402
from corps.serve.background import BackgroundServer  # noqa: E402

KEY = "sk-errors-test"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def served(tiny_dirs):
    opened = Engine.open(
        str(tiny_dirs["llama"]), dtype="float32", capacity=4096, leak_policy="deny"
    )
    with BackgroundServer(opened, model="tiny", api_key=KEY) as s:
        yield s


HTTP = httpx.Client(timeout=60)


def post(served, body, path="/v1/chat/completions") -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {**AUTH, "content-type": "application/json"}
    return HTTP.post(served.url + path, content=content, headers=headers)


def state(served) -> tuple[int, int]:
    """What a refused request must leave as it was: store slots in use, live messages.

    A call cancelled by a stream that ended is aborted by the engine's loop at its next
    step, just after the response: wait (bounded) until no call is left in the loop."""
    settled = threading.Event()
    for _ in range(1000):
        s = served.engine.stats()
        if s.running == 0 and s.queue_depth == 0:
            break
        settled.wait(0.01)
    return s.tokens_used, s.messages


def assert_error(r: httpx.Response, status: int | None = None) -> dict:
    assert r.status_code != 500 and r.status_code >= 400, r.text
    if status is not None:
        assert r.status_code == status, r.text
    err = r.json()["error"]
    assert isinstance(err["message"], str) and isinstance(err["type"], str)
    assert set(err) == {"message", "type", "param", "code"}
    return err


def new_then(extra: dict) -> list[dict]:
    """New content first (encoded before the bad part is reached, on today's main)."""
    return [{"role": "user", "content": "a fresh message nobody sent before"}, extra]


BAD_SCHEMA = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"messages": new_then({"role": "user", "content": "q"}), "max_tokens": 10**6}, 400),
        ({"messages": new_then({"role": "user", "content": "q"}), "response_format": BAD_SCHEMA},
         400),
        ({"messages": new_then({"role": "user", "content": "q"}), "response_format": BAD_SCHEMA,
          "tools": [{"type": "function", "function": {"name": "f"}}]}, 400),
        ({"messages": new_then({"role": "user", "corps_message_id": "msg_" + "a" * 32})}, 404),
        ({"messages": new_then({"role": "assistant", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f" * 65, "arguments": "{"}}]})},
         400),
        ({"messages": new_then({"role": "user", "content": "x" * 200_000})}, 400),
    ],
)  # fmt: skip
@pytest.mark.parametrize("stream", [False, True])
def test_a_refused_request_leaves_nothing(served, body, status, stream):
    before = state(served)
    r = post(served, {**body, "stream": stream})
    assert_error(r, status)  # streamed or not: the same status, before any stream
    assert state(served) == before


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("past", ["max_tokens", "engine"])
def test_a_prompt_past_the_context_is_openais_context_length_exceeded(served, stream, past):
    """Past the context, found from the request (max_tokens alone) or only by the
    engine (a short prompt whose max_tokens leaves it no room): 400 with OpenAI's
    `code: "context_length_exceeded"`, which clients look for to trim a history;
    nothing kept. It was `code: null` in corps' own words."""
    context = served.engine.context_length
    max_tokens = 10**6 if past == "max_tokens" else context - 2
    before = state(served)
    r = post(served, {"messages": new_then({"role": "user", "content": "a question"}),
                      "max_tokens": max_tokens, "stream": stream})  # fmt: skip
    err = assert_error(r, 400)
    assert err["code"] == "context_length_exceeded" and err["param"] == "messages"
    assert str(context) in err["message"]
    assert state(served) == before


def test_a_leak_denied_after_new_content_leaves_nothing_and_quotes_nothing(served):
    """Alice's public message built on her private one; Bob names it after new content:
    403 under deny, streamed or not, without a byte of the secret; nothing kept."""
    first = post(served, {"corps_agent": "alice", "max_tokens": 2, "messages": [
        {"role": "user", "content": "the code is 9931-marlin", "corps_visibility": "private"},
        {"role": "user", "content": "what next?"}]}).json()  # fmt: skip
    built_on_secret = first["corps"]["prompt"][1]
    before = state(served)
    for stream in (False, True):
        r = post(served, {"corps_agent": "bob", "stream": stream, "messages": new_then(
            {"role": "user", "corps_message_id": built_on_secret})})  # fmt: skip
        err = assert_error(r, 403)
        assert "9931" not in r.text and "marlin" not in r.text and "deny" in err["message"]
    assert state(served) == before


def test_a_seed_of_any_size_is_accepted_streamed_or_not(served):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "seed": 10**23,
            "temperature": 1.0}  # fmt: skip
    assert post(served, body).status_code == 200
    r = post(served, {**body, "stream": True})
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        (b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', "/v1/chat/completions"),
        (b'{"messages": [', "/v1/chat/completions"),
        (b"[" * 50_000 + b"]" * 50_000, "/v1/chat/completions"),
        (b"{}", "/v1/nothing-here"),
        (b'{"prompt": 5}', "/v1/completions"),
    ],
)
def test_bad_bytes_and_unknown_routes_are_openai_errors(served, raw, path):
    assert_error(post(served, raw, path))


def test_a_wrong_method_is_an_openai_error(served):
    assert_error(httpx.get(served.url + "/v1/chat/completions", headers=AUTH), 405)


def test_a_streamed_failure_ends_with_an_error_event_and_done(served, monkeypatch):
    """A failure after the 200 (here the engine's stream raising mid-way) is an error
    event, then [DONE]; the request's new message is given back."""
    from corps.engine.errors import EngineClosed

    engine = served.engine
    real = engine.stream

    def failing(**args):
        stream = real(**args)
        inner = stream.pieces  # what the server iterates (deltas with their tokens)

        def pieces():
            gen = inner()

            async def deltas():
                yield await gen.__anext__()
                await gen.aclose()
                raise EngineClosed("closing")

            return deltas()

        stream.pieces = pieces
        return stream

    before = state(served)
    monkeypatch.setattr(engine, "stream", failing)
    new = [{"role": "user", "content": "one more new message"}]
    r = post(served, {"stream": True, "max_tokens": 8, "temperature": 0, "messages": new})
    monkeypatch.undo()
    events = [e[len("data: ") :] for e in r.text.strip().split("\n\n")]
    assert r.status_code == 200 and events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["type"] == "server_error"
    assert state(served) == before


def test_streamed_completions_send_only_the_continuation_with_real_usage(served):
    body = {"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0}
    whole = post(served, body, "/v1/completions").json()
    r = post(served, {**body, "stream": True, "stream_options": {"include_usage": True}},
             "/v1/completions")  # fmt: skip
    chunks = [json.loads(e[6:]) for e in r.text.strip().split("\n\n")[:-1]]
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == whole["choices"][0]["text"] and "France" not in text
    assert chunks[-1]["usage"]["prompt_tokens"] == whole["usage"]["prompt_tokens"] > 0
    echoed = post(served, {**body, "stream": True, "echo": True}, "/v1/completions")
    assert "The capital of France is" in echoed.text


# ---- fuzz ----

JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**30), 10**30), st.floats(allow_nan=False),
    st.text(max_size=20), st.lists(st.integers(), max_size=3), st.dictionaries(
        st.text(max_size=5), st.integers(), max_size=2),
)  # fmt: skip
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool", "boss", 5])},
    optional={
        "content": st.one_of(st.text(max_size=40), JUNK),
        "corps_message_id": st.one_of(st.just("msg_" + "0" * 32), st.text(max_size=40), JUNK),
        "offset": st.one_of(st.integers(-5, 10**12), JUNK),
        "corps_visibility": st.sampled_from(["private", "public", "secret"]),
        "tool_calls": st.lists(st.fixed_dictionaries({"function": st.fixed_dictionaries(
            {"name": st.text(max_size=8), "arguments": st.one_of(st.text(max_size=12), JUNK)})}),
            max_size=2),
    },
)  # fmt: skip
BODY = st.fixed_dictionaries(
    {"messages": st.one_of(st.lists(MESSAGE, min_size=1, max_size=3), JUNK)},
    optional={
        "max_tokens": st.one_of(st.integers(-3, 4), st.integers(10**5, 10**40), JUNK),
        "temperature": st.one_of(st.floats(-1, 3, allow_nan=False), JUNK),
        "top_p": st.one_of(st.floats(-1, 2, allow_nan=False), JUNK),
        "seed": st.one_of(st.integers(-(10**40), 10**40), JUNK),
        "n": st.one_of(st.integers(-1, 20), JUNK),
        "stop": st.one_of(st.text(max_size=5), st.lists(st.text(max_size=3), max_size=20), JUNK),
        "stream": st.booleans(),
        "logprobs": st.one_of(st.booleans(), JUNK),
        "top_logprobs": st.one_of(st.integers(-1, 30), JUNK),
        "response_format": st.one_of(
            st.just(BAD_SCHEMA), st.just({"type": "json_object"}), JUNK,
            st.fixed_dictionaries({"type": st.just("json_schema"), "json_schema":
                                   st.fixed_dictionaries({"schema": st.dictionaries(
                                       st.sampled_from(["type", "enum", "maxLength"]), JUNK,
                                       max_size=2)})})),
        "tools": st.one_of(st.just([{"type": "function", "function": {"name": "f"}}]), JUNK),
        "tool_choice": st.one_of(st.sampled_from(["auto", "required", "none", "x"]), JUNK),
        "corps_agent": st.one_of(st.sampled_from(["alice", "a/b", ""]), JUNK),
        "logit_bias": st.one_of(st.dictionaries(st.one_of(st.sampled_from(["5", "999999", "-1"]),
                                                          st.text(max_size=4)),
                                                st.one_of(st.floats(-200, 200), JUNK), max_size=3),
                                JUNK),
        "parallel_tool_calls": st.one_of(st.booleans(), JUNK),
        "functions": st.one_of(st.just([{"name": "f", "parameters": {"type": "object"}}]), JUNK),
        "function_call": st.one_of(st.sampled_from(["auto", "none"]), st.just({"name": "f"}),
                                   JUNK),
        "model": st.one_of(st.just("tiny"), st.text(max_size=5)),
    },
)  # fmt: skip
RAW = st.one_of(
    st.binary(max_size=64),
    st.integers(1, 3000).map(lambda d: b'{"messages": ' + b"[" * d + b"]" * d + b"}"),
    st.text(max_size=30).map(lambda t: ('{"messages": [{"role": "user", "content": "' + t)
                             .encode()),
)  # fmt: skip


def _capped(body):
    """Keep a valid body cheap to answer: a few tokens at most."""
    if isinstance(body, dict) and isinstance(body.get("max_tokens"), int):
        body["max_tokens"] = (
            min(body["max_tokens"], 4) if body["max_tokens"] < 10**5 else (body["max_tokens"])
        )
    elif isinstance(body, dict):
        body["max_tokens"] = 3
    return body


@settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=st.one_of(BODY.map(_capped), RAW), path=st.sampled_from(
    ["/v1/chat/completions", "/v1/completions"]))  # fmt: skip
def test_fuzzed_bodies_never_500_and_refusals_change_nothing(served, body, path):
    if isinstance(body, dict) and path == "/v1/completions":
        body = {**body, "prompt": body.get("messages") if body.get("n") != 2 else "ok"}
    before = state(served)
    r = post(served, body, path)
    assert r.status_code != 500, r.text
    if r.status_code >= 400:
        assert_error(r)
        assert state(served) == before, r.text
    elif isinstance(body, dict) and body.get("stream"):
        assert r.text.rstrip().endswith("data: [DONE]")
    assert HTTP.get(served.url + "/health").status_code == 200


def test_unknown_fields_are_accepted_and_named_as_ignored(served):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
            "presence_penalty": 0.5, "user": "u-1"}  # fmt: skip
    r = post(served, body)
    assert r.status_code == 200 and r.json()["corps"]["ignored"] == ["presence_penalty", "user"]
    plain = {"messages": body["messages"], "max_tokens": 2}
    assert "ignored" not in post(served, plain).json()["corps"]


def test_a_refusal_at_admission_is_its_status_streamed_with_n(served, monkeypatch):
    """A call the engine refuses when it is admitted (here its queue full): the status of
    that refusal before any stream, for each of n streamed choices, nothing kept."""
    from corps.engine.errors import EngineBusy

    engine, real = served.engine, served.engine.stream
    streams = []

    def refused(**args):  # the second choice's call is refused when admitted
        stream = real(**args)
        streams.append(stream)
        if len(streams) == 2:

            async def deltas():
                raise EngineBusy("full")
                yield  # an async generator

            stream.pieces = deltas  # what the server iterates
        return stream

    before = state(served)
    monkeypatch.setattr(engine, "stream", refused)
    body = {"messages": [{"role": "user", "content": "a message for a full queue"}],
            "stream": True, "n": 2, "max_tokens": 4}  # fmt: skip
    r = post(served, body)
    monkeypatch.undo()
    assert_error(r, 429)
    assert state(served) == before
