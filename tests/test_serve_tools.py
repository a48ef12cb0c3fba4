"""engine/request/tools.py and serve/tools.py: tool-call syntax per model family, the
grammar of tool replies, and their parse whole, cut and streamed; then against a real
uvicorn server with the official `openai` client: streamed calls the SDK's stream
helper rebuilds exactly as the unstreamed reply, cut calls, `auto` replies that never
break, parallel calls, legacy functions, logit_bias, streamed logprobs and n > 1."""

from __future__ import annotations

import itertools
import json
import shutil

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st
from llguidance import LLMatcher

from corps.engine.request.tools import HERMES, JSON_CALLS, LLAMA3, Offer, parse, syntax_of
from corps.serve.tools import Streamer

WEATHER_ARGS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}},
    "required": ["city"],
    "additionalProperties": False,
}
NOTHING = {"type": "object", "properties": {}, "additionalProperties": False}
TOOLS = (("get_weather", "The weather in a city", WEATHER_ARGS), ("get_time", "", NOTHING))
SYNTAXES = [JSON_CALLS, HERMES, LLAMA3]


def test_the_syntax_follows_the_chat_template():
    assert syntax_of("{{ '<tool_call>' }}") is HERMES  # Qwen2.5 / Qwen3 / Hermes
    assert syntax_of("<|start_header_id|>ipython<|end_header_id|>") is LLAMA3
    assert syntax_of("<|im_start|>{{ message['role'] }}") is JSON_CALLS  # SmolLM2
    assert syntax_of(None) is JSON_CALLS


@pytest.mark.parametrize("syntax", SYNTAXES, ids=lambda s: s.name)
@pytest.mark.parametrize("choice", ["auto", "required", "get_weather"])
@pytest.mark.parametrize("parallel", [True, False])
def test_every_offer_compiles(syntax, choice, parallel):
    grammar = Offer(syntax, TOOLS, choice, parallel).grammar()
    assert LLMatcher.validate_grammar(LLMatcher.grammar_from_lark(grammar)) == ""


@pytest.mark.parametrize("syntax", SYNTAXES, ids=lambda s: s.name)
def test_whole_cut_and_parallel_replies_parse(syntax):
    one = syntax.render([("get_weather", {"city": "Paris"})])
    two = syntax.render([("get_weather", {"city": "Oslo"}), ("get_time", {})])
    assert parse(syntax, "It is sunny.") == ("It is sunny.", [])
    content, (call,) = parse(syntax, one)
    assert content is None and (call.name, call.arguments, call.complete) == (
        "get_weather", '{"city": "Paris"}', True)  # fmt: skip
    _, calls = parse(syntax, two)
    assert [(c.name, c.arguments, c.complete) for c in calls] == [
        ("get_weather", '{"city": "Oslo"}', True), ("get_time", "{}", True)]  # fmt: skip
    cut = one[: one.index("Paris") + 2]
    _, (call,) = parse(syntax, cut)
    assert (call.name, call.arguments, call.complete) == ("get_weather", '{"city": "Pa', False)


ANSWER = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "score": {"type": "integer"}},
    "required": ["name", "score"],
    "additionalProperties": False,
}


@given(
    syntax=st.sampled_from(SYNTAXES),
    calls=st.lists(
        st.tuples(st.sampled_from(["get_weather", "get_time"]),
                  st.dictionaries(st.sampled_from(["city", "n", "x"]),
                                  st.one_of(st.text(max_size=6), st.integers(-99, 999),
                                            st.lists(st.booleans(), max_size=2)), max_size=3)),
        min_size=1, max_size=3),
    answer=st.one_of(st.none(), st.fixed_dictionaries(
        {"name": st.sampled_from(["get_weather", "get_w", "x"]), "score": st.integers(-9, 99)})),
    typed=st.booleans(),
    cuts=st.lists(st.integers(0, 200), max_size=12),
    keep=st.integers(1, 400),
)  # fmt: skip
def test_streamed_deltas_rebuild_the_parse_of_the_whole(syntax, calls, answer, typed, cuts, keep):
    """Oracle: the offer's `parse` of the whole (possibly cut) text: calls, or (with a
    response format) JSON content that may begin as a call does. However the text is
    split into deltas, the deltas rebuild, as the SDK joins them, the same content and
    calls."""
    offer = Offer(syntax, TOOLS, "auto", content=ANSWER if typed or answer else None)
    text = (json.dumps(answer) if answer is not None else syntax.render(calls))[:keep]
    streamer = Streamer(offer)
    built: dict[int, dict] = {}
    content = None
    bounds = sorted({0, len(text), *[c for c in cuts if c < len(text)]})
    for a, b in itertools.pairwise(bounds):
        for d in streamer.feed(text[a:b]):
            if "content" in d:
                content = (content or "") + d["content"]
                continue
            for tc in d["tool_calls"]:
                slot = built.setdefault(tc["index"], {"name": None, "arguments": ""})
                if "id" in tc:
                    assert slot["name"] is None  # announced once, first
                    slot["name"] = tc["function"]["name"]
                slot["arguments"] += tc["function"]["arguments"]
    whole_content, whole = offer.parse(text)
    assert content == whole_content
    expected = [(c.name, c.arguments) for c in whole]
    assert [(built[i]["name"], built[i]["arguments"]) for i in sorted(built)] == expected


def test_free_text_streams_as_content():
    s = Streamer(Offer(JSON_CALLS, TOOLS, "auto"))
    assert s.feed("Hel") == [{"content": "Hel"}] and s.feed("lo {") == [{"content": "lo {"}]


@pytest.mark.parametrize("syntax", SYNTAXES, ids=lambda s: s.name)
def test_with_a_response_format_content_is_json_of_its_schema_or_a_call(syntax):
    """Tools and a schema in one offer: the grammar admits a call or JSON content that
    matches the schema, nothing else; content that begins as a call's name does is
    still content, told apart once it stops matching the call."""
    offer = Offer(syntax, TOOLS, "auto", content=ANSWER)
    matcher = LLMatcher.grammar_from_lark(offer.grammar())
    assert LLMatcher.validate_grammar(matcher) == ""
    answer = json.dumps({"name": "get_weather", "score": 3})
    call = syntax.render([("get_weather", {"city": "Paris"})])
    assert offer.parse(answer) == (answer, [])
    assert offer.parse(call)[1][0].name == "get_weather"
    assert offer.kind('{"name": "get_w') is (None if not syntax.open else "content")
    assert Offer(syntax, TOOLS, "auto").parse("It is sunny.") == ("It is sunny.", [])


@pytest.mark.parametrize("syntax", SYNTAXES, ids=lambda s: s.name)
def test_a_cut_call_renders_as_the_model_wrote_it(syntax):
    """A call cut inside its arguments, sent back as its name and arguments' text,
    renders to the very text the model wrote; a whole call as `render` writes it."""
    whole = syntax.render([("get_weather", {"city": "Paris"})])
    cut = whole[: whole.index("Paris") + 2]
    (c,) = parse(syntax, cut)[1]
    assert syntax.render_text([(c.name, c.arguments)]) == cut
    (w,) = parse(syntax, whole)[1]
    assert syntax.render_text([(w.name, w.arguments)]) == whole


# ---- against a server ----

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from corps.engine.api.engine import Engine  # noqa: E402
from corps.serve.background import BackgroundServer  # noqa: E402

WEATHER = {"type": "function", "function": {"name": "get_weather",
           "description": "The weather in a city", "parameters": WEATHER_ARGS}}  # fmt: skip
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": NOTHING}}


def serve(model_dir, **kw):
    opened = Engine.open(str(model_dir), dtype="float32", capacity=8192, **kw)
    return BackgroundServer(opened, model="m")


@pytest.fixture(scope="module")
def served(tiny_dirs):
    with serve(tiny_dirs["llama"]) as s:
        yield s


@pytest.fixture
def client(served):
    return openai.OpenAI(base_url=served.url + "/v1", api_key="none", max_retries=0)


def streamed(client, **kw):
    """The completion the SDK's stream helper accumulates from the chunks (its snapshot:
    `get_final_completion` refuses a reply cut by max_tokens)."""
    with client.chat.completions.stream(**kw) as stream:
        for _ in stream:
            pass
        return stream.current_completion_snapshot


def messages(text="weather in Paris?"):
    return [{"role": "user", "content": text}]


def calls_of(message) -> list[tuple[str, str]]:
    return [(c.function.name, c.function.arguments) for c in message.tool_calls or []]


@pytest.mark.parametrize(
    "choice", ["required", "auto", {"type": "function", "function": {"name": "get_weather"}}]
)
@pytest.mark.parametrize("prompt", ["weather in Paris?", "what time is it", "hello"])
def test_streamed_calls_rebuild_exactly_the_unstreamed_ones(client, choice, prompt):
    """Greedy, the same request streamed and not: the SDK's stream helper accumulates
    the same content, calls (names and argument text) and finish reason."""
    kw = dict(model="m", messages=messages(prompt), tools=[WEATHER, CLOCK], tool_choice=choice,
              max_tokens=80, temperature=0)  # fmt: skip
    whole = client.chat.completions.create(**kw).choices[0]
    final = streamed(client, **kw).choices[0]
    assert calls_of(final.message) == calls_of(whole.message)
    assert final.message.content == whole.message.content
    assert final.finish_reason == whole.finish_reason
    if whole.finish_reason == "tool_calls":
        for name, arguments in calls_of(whole.message):
            schema = WEATHER_ARGS if name == "get_weather" else NOTHING
            jsonschema.validate(json.loads(arguments), schema)


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_cut_by_max_tokens_comes_back_as_a_call_with_finish_length(client, stream):
    """The same greedy call, whole and cut four tokens before its end: the cut one is in
    tool_calls, same name, its arguments a prefix of the whole's, finish "length"."""
    kw = dict(model="m", messages=messages(), tools=[WEATHER], tool_choice="required",
              temperature=0, parallel_tool_calls=False)  # fmt: skip
    whole = client.chat.completions.create(**kw, max_tokens=200)
    ((name, arguments),) = calls_of(whole.choices[0].message)
    budget = whole.usage.completion_tokens - 4  # inside the arguments: past end and closers
    if stream:
        choice = streamed(client, **kw, max_tokens=budget).choices[0]
    else:
        choice = client.chat.completions.create(**kw, max_tokens=budget).choices[0]
    assert choice.finish_reason == "length"
    ((cut_name, cut_arguments),) = calls_of(choice.message)
    assert cut_name == name and arguments.startswith(cut_arguments) and cut_arguments != arguments


def test_parallel_calls_each_well_formed_and_one_when_not_parallel(client, served):
    """Seeded samples over two tools, nudged towards the newline that starts another
    call: replies hold several calls, each whole one validates (a reply the budget cut
    has its last call cut); with parallel_tool_calls false there is at most one."""
    (newline,) = served.engine.tokenizer.encode("\n", add_special_tokens=False)
    seen_many = False
    for seed in range(6):
        kw = dict(model="m", messages=messages(), tools=[WEATHER, CLOCK],
                  tool_choice="required", max_tokens=160, temperature=1.0, seed=seed,
                  logit_bias={str(newline): 4})  # fmt: skip
        r = client.chat.completions.create(**kw).choices[0]
        calls = calls_of(r.message)
        seen_many |= len(calls) > 1
        whole = calls if r.finish_reason == "tool_calls" else calls[:-1]
        for name, arguments in whole:
            jsonschema.validate(json.loads(arguments),
                                WEATHER_ARGS if name == "get_weather" else NOTHING)  # fmt: skip
        one = client.chat.completions.create(**kw, parallel_tool_calls=False).choices[0]
        assert len(one.message.tool_calls or []) <= 1
    assert seen_many


def test_legacy_functions_are_tools(client):
    r = client.chat.completions.create(
        model="m", messages=messages(), max_tokens=80, temperature=0,
        functions=[WEATHER["function"]], function_call={"name": "get_weather"},
    ).choices[0]  # fmt: skip
    assert r.finish_reason == "function_call" and r.message.function_call.name == "get_weather"
    jsonschema.validate(json.loads(r.message.function_call.arguments), WEATHER_ARGS)


def test_logit_bias_bans_and_favours_the_greedy_token(client, tiny_dirs):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_dirs["llama"]))
    kw = dict(model="m", messages=messages("hello"), max_tokens=1, temperature=0, logprobs=True)
    first = client.chat.completions.create(**kw).choices[0].logprobs.content[0].token
    ids = [i for i in range(len(tok)) if tok.decode([i]) == first]
    banned = client.chat.completions.create(**kw, logit_bias={str(i): -100 for i in ids})
    assert banned.choices[0].logprobs.content[0].token != first
    other = next(i for i in range(40, len(tok)) if tok.decode([i]) not in ("", first))
    favoured = client.chat.completions.create(**kw, logit_bias={str(other): 100})
    assert favoured.choices[0].logprobs.content[0].token == tok.decode([other])


def test_streamed_logprobs_and_n_equal_the_unstreamed(client):
    kw = dict(model="m", messages=messages("hello"), max_tokens=6, temperature=1.0, seed=11,
              n=3, logprobs=True)  # fmt: skip
    whole = client.chat.completions.create(**kw)
    final = streamed(client, **kw)
    assert [c.index for c in final.choices] == [0, 1, 2]
    for a, b in zip(whole.choices, final.choices, strict=True):
        assert a.message.content == b.message.content
        assert [x.token for x in a.logprobs.content] == [x.token for x in b.logprobs.content]
        assert [x.logprob for x in a.logprobs.content] == pytest.approx(
            [x.logprob for x in b.logprobs.content]
        )
    assert final.system_fingerprint == whole.system_fingerprint and whole.system_fingerprint


def test_streamed_logprobs_come_with_their_own_deltas(client):
    """Each content chunk carries the logprobs of the tokens it shows (OpenAI's stream
    pairs them; a client that joins deltas with logprobs needs it), and a choice's
    chunks together carry exactly the unstreamed reply's logprobs."""
    kw = dict(model="m", messages=messages("hello"), max_tokens=12, temperature=0,
              logprobs=True, top_logprobs=2)  # fmt: skip
    whole = client.chat.completions.create(**kw).choices[0].logprobs.content
    chunks = list(client.chat.completions.create(**kw, stream=True))
    shown = [c.choices[0] for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(shown) >= 2
    assert all(c.logprobs is not None and c.logprobs.content for c in shown[:-1])
    joined = [x for c in chunks if c.choices and c.choices[0].logprobs
              for x in c.choices[0].logprobs.content or []]  # fmt: skip
    assert [x.token for x in joined] == [x.token for x in whole]
    assert [x.logprob for x in joined] == pytest.approx([x.logprob for x in whole])
    assert [[t.token for t in x.top_logprobs] for x in joined] == [
        [t.token for t in x.top_logprobs] for x in whole
    ]


VERDICT = {
    "type": "object",
    "properties": {"verdict": {"enum": ["yes", "no"]}, "score": {"type": "integer"}},
    "required": ["verdict", "score"],
    "additionalProperties": False,
}
TYPED = {"type": "json_schema", "json_schema": {"name": "v", "schema": VERDICT, "strict": True}}


@pytest.mark.parametrize("stream", [False, True])
def test_tools_with_a_response_format_reply_a_call_or_json_of_the_schema(client, served, stream):
    """The typed-agent pattern (a schema beside tools, `auto`): 30 sampled replies,
    streamed and not, half nudged towards a call's first key; every one is whole calls
    or content that validates against the schema, and both occur. Before, the schema
    was dropped: content was free text."""
    get = served.engine.tokenizer.encode("n", add_special_tokens=False)
    kinds = set()
    for seed in range(30):
        kw = dict(model="m", messages=messages(f"question {seed}"), tools=[WEATHER, CLOCK],
                  response_format=TYPED, max_tokens=60, temperature=1.0, seed=seed,
                  logit_bias={str(t): 8.0 for t in get} if seed % 2 else None)  # fmt: skip
        choice = streamed(client, **kw) if stream else client.chat.completions.create(**kw)
        c = choice.choices[0]
        if c.finish_reason == "length":
            continue
        if c.message.tool_calls:
            kinds.add("calls")
            assert c.finish_reason == "tool_calls" and not c.message.content
            for name, arguments in calls_of(c.message):
                jsonschema.validate(json.loads(arguments),
                                    WEATHER_ARGS if name == "get_weather" else NOTHING)  # fmt: skip
        else:
            kinds.add("content")
            jsonschema.validate(json.loads(c.message.content), VERDICT)
    assert kinds == {"calls", "content"}


def test_tools_with_a_schema_streamed_with_n_choices_equal_the_unstreamed(client):
    """A schema beside tools, seeded, n=3: each streamed choice rebuilds the unstreamed
    one (its calls or its JSON content), and every content parses as the schema."""
    kw = dict(model="m", messages=messages("q"), tools=[WEATHER, CLOCK], response_format=TYPED,
              max_tokens=60, temperature=1.0, seed=5, n=3)  # fmt: skip
    whole = client.chat.completions.create(**kw)
    final = streamed(client, **kw)
    for a, b in zip(whole.choices, final.choices, strict=True):
        assert (a.message.content, calls_of(a.message)) == (b.message.content, calls_of(b.message))
        if a.message.content and a.finish_reason != "length":
            jsonschema.validate(json.loads(a.message.content), VERDICT)


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_the_server_cut_is_accepted_back_in_the_history(client, stream):
    """The Agents SDK's second turn after a cut call: the assistant message with the
    cut call's arguments as they came, then the tool's output. Accepted (it was a 400:
    "arguments must be a JSON text"), and the cut reply is found, not encoded again."""
    kw = dict(model="m", messages=messages(), tools=[WEATHER], tool_choice="required",
              temperature=0, parallel_tool_calls=False)  # fmt: skip
    whole = client.chat.completions.create(**kw, max_tokens=200)
    cut = client.chat.completions.create(**kw, max_tokens=whole.usage.completion_tokens - 4)
    (call,) = cut.choices[0].message.tool_calls
    with pytest.raises(ValueError):
        json.loads(call.function.arguments)
    history = [*messages(), cut.choices[0].message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]  # fmt: skip
    again = dict(kw, messages=history, tool_choice="auto", max_tokens=8)
    r = streamed(client, **again) if stream else client.chat.completions.create(**again)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    if not stream:  # everything before the tool's output was in the store already
        assert r.corps["prompt"][: len(cut.corps["prompt"]) + 1] == [
            *cut.corps["prompt"], cut.choices[0].message.corps["id"]]  # fmt: skip


def auto_replies(client, n_prompts=10, n=10, max_tokens=48, nudge: dict | None = None) -> list:
    """n_prompts x n sampled `auto` replies; the second half with `nudge` (a logit_bias
    towards a call's first token: a random model rarely starts one on its own)."""
    out = []
    for i in range(n_prompts):
        bias = nudge if nudge and i >= n_prompts // 2 else None
        r = client.chat.completions.create(
            model="m", messages=messages(f"question {i}: what is the weather or the time?"),
            tools=[WEATHER, CLOCK], max_tokens=max_tokens, temperature=1.0, seed=i, n=n,
            logit_bias=bias,
        )  # fmt: skip
        out += r.choices
    return out


def assert_no_broken_call(choices) -> None:
    """A reply that starts a call parses against its tool's schema unless cut."""
    for c in choices:
        if c.message.tool_calls and c.finish_reason != "length":
            assert c.finish_reason == "tool_calls"
            for name, arguments in calls_of(c.message):
                jsonschema.validate(json.loads(arguments),
                                    WEATHER_ARGS if name == "get_weather" else NOTHING)  # fmt: skip
        elif not c.message.tool_calls:
            assert not (c.message.content or "").startswith(("{", "<tool_call>"))


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral", "qwen3-hermes"])
def test_auto_never_breaks_a_call_on_each_family(tiny_dirs, tmp_path, arch):
    """100 sampled `auto` replies per family (and Qwen's own `<tool_call>` syntax, from
    a chat template that has it): 0 replies that start a call and fail to parse."""
    model_dir = tiny_dirs[arch.split("-")[0]]
    if arch.endswith("hermes"):
        model_dir = tmp_path / "hermes"
        shutil.copytree(tiny_dirs["qwen3"], model_dir)
        template = model_dir / "chat_template.jinja"
        template.write_text(template.read_text() + "{# tools: <tool_call> #}")
    with serve(model_dir) as s:
        syntax = s.app.state.syntax
        assert (syntax is HERMES) == arch.endswith("hermes")
        (first,) = s.engine.tokenizer.encode(syntax.first, add_special_tokens=False)
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
        choices = auto_replies(client, nudge={str(first): 6.0})
    assert len(choices) == 100
    assert_no_broken_call(choices)
    assert any(c.message.tool_calls for c in choices)  # both kinds of reply occur
    assert any(not c.message.tool_calls for c in choices)


def test_auto_never_breaks_a_call_on_the_default_model(real_dir):
    """The 135M model left alone answers in text; nudged towards "{" (half of the
    prompts), it calls, and every call it finishes parses against its schema."""
    with serve(real_dir) as s:
        (first,) = s.engine.tokenizer.encode("{", add_special_tokens=False)
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
        choices = auto_replies(client, max_tokens=40, nudge={str(first): 5.0})
    assert len(choices) == 100
    assert_no_broken_call(choices)
    assert any(c.message.tool_calls for c in choices)
