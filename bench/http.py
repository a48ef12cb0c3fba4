"""`corps bench http`: the cost of the HTTP layer, measured side by side in one run.

The same workload twice per round, rounds alternating: N clients each making M
chat requests one after another (a user message, a greedy reply of T tokens),
once through the Python API (`prefill` + `decode` on an engine in this process)
and once through `corps serve` on a loopback port with the official `openai`
client (its async client, in a process of its own, as a server's clients are),
over an engine of the same settings. Every reply
is checked (a non-empty choice, its usage). Reported: requests and tokens per
second, p50 / p99 latency per request, and HTTP over Python.
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

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
    from corps.engine import Engine

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


def served(cfg, model: str):
    """`corps serve` over an engine of `cfg`, in this process (`BackgroundServer`)."""
    from corps.engine import Engine
    from corps.serve.background import BackgroundServer

    return BackgroundServer(Engine.open(cfg), model=model)


def http_cell(cfg, model: str, clients: int, requests: int, tokens: int) -> Cell:
    """The workload through `corps serve`, its clients (the `openai` SDK's async client,
    one task each) in a process of their own (`in_client_process`)."""
    with served(cfg, model) as server:
        args = (server.url + "/v1", model, clients, requests, tokens)
        seconds, tokens_got, latencies = in_client_process(_client_process, args)
    return Cell("http", seconds, clients * requests, tokens_got, latencies)


def in_client_process(target, args: tuple, timeout_s: float = 3600):
    """`target(*args, results)` in a spawned process of its own (as a server's clients
    are: in this one they would contend with the server for the interpreter lock): what
    it put on `results`, or RuntimeError with the error it put there as text."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, results), daemon=True)
    proc.start()
    got = results.get(timeout=timeout_s)
    proc.join(60)
    if isinstance(got, str):
        raise RuntimeError(f"the HTTP clients failed: {got}")
    return got


def _client_process(url, model, clients, requests, tokens, results) -> None:
    """The clients' process: (seconds, tokens, latencies) on `results`, or the error."""
    import asyncio

    try:
        results.put(asyncio.run(_clients(url, model, clients, requests, tokens)))
    except Exception as exc:  # reported to the parent, which raises it
        results.put(repr(exc))


async def _clients(url, model, clients, requests, tokens):
    import asyncio

    from openai import AsyncOpenAI

    api = AsyncOpenAI(base_url=url, api_key="none", max_retries=0)
    await api.models.list()  # connected before the clock starts
    latencies: list[float] = []
    got = 0

    async def client(c: int) -> None:
        nonlocal got
        for i in range(requests):
            t0 = time.perf_counter()
            r = await api.chat.completions.create(
                model=model, messages=[{"role": "user", "content": prompt_of(c, i)}],
                max_tokens=tokens, temperature=0.0,
            )  # fmt: skip
            if not r.choices or r.usage.completion_tokens < 1:
                raise RuntimeError(f"an empty reply to client {c}, question {i}")
            got += r.usage.completion_tokens
            latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))
    return time.perf_counter() - t0, got, latencies


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


# ---- a workflow over HTTP: text resent (the plain API) vs messages by id ----

QUESTION = "A train travels 60 km in 45 minutes. What is its speed in km/h?"


@dataclass
class Flow:
    """One tree of thoughts run over HTTP."""

    variant: str  # "plain (baseline mode)" or "by id (choreographed)"
    wall_s: float
    ttft_s: list[float]  # per call, from request to first content chunk
    tokens_encoded: int  # the server's engine: tokens run through the model
    tokens_reused: int


def _first_token(api, model: str, messages: list[dict], tokens: int, seed: int):
    """(seconds to the first content chunk, the reply's text, its message id)."""
    t0 = time.perf_counter()
    first, text, mid = None, [], None
    for chunk in api.chat.completions.create(
        model=model, messages=messages, max_tokens=tokens, temperature=0.8, seed=seed,
        stream=True,
    ):  # fmt: skip
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.perf_counter() - t0
            text.append(chunk.choices[0].delta.content)
        extra = chunk.model_extra.get("corps") if chunk.model_extra else None
        if extra:
            mid = extra["id"]
    return first or time.perf_counter() - t0, "".join(text), mid


def flow(cfg, model: str, by_id: bool, branches: int, voters: int, tokens: int) -> Flow:
    """Proposals over one question, then votes over all of them, each call a stream
    (the calls of a stage at once): by id, or resending the text of everything."""
    from openai import OpenAI

    mode = "choreographed" if by_id else "baseline"
    with served(cfg.model_copy(update={"mode": mode}), model) as server:
        api = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        engine = server.engine
        before = engine.stats()
        t0 = time.perf_counter()
        q = api.chat.completions.create(
            model=model, messages=[{"role": "user", "content": QUESTION}], max_tokens=1
        ).model_extra["corps"]["prompt"][-1]
        question = {"role": "user", "corps_message_id": q} if by_id else {
            "role": "user", "content": QUESTION}  # fmt: skip
        with ThreadPoolExecutor(max(branches, voters)) as pool:
            made = list(pool.map(lambda i: _first_token(api, model, [question], tokens, i),
                                 range(branches)))  # fmt: skip
            shown = [
                {"role": "assistant", "corps_message_id": mid} if by_id
                else {"role": "assistant", "content": text}
                for _, text, mid in made
            ]  # fmt: skip
            ballot = [
                question,
                *shown,
                {"role": "user", "content": "Which answer is right? Reply with its number."},
            ]
            votes = list(pool.map(lambda i: _first_token(api, model, ballot, 8, 100 + i),
                                  range(voters)))  # fmt: skip
        wall = time.perf_counter() - t0
        after = engine.stats()
    return Flow(
        "by id (choreographed)" if by_id else "plain (baseline mode)",
        wall,
        [t for t, _, _ in made + votes],
        after.tokens_encoded - before.tokens_encoded,
        after.tokens_reused - before.tokens_reused,
    )


# ---- structured outputs and tool calls from the model ----

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
CITIES = ["Paris", "Lima", "Oslo", "Cairo", "Tokyo", "Quito", "Perth", "Seoul"]


def is_person(text: str | None) -> bool:
    """Whether `text` is JSON that `PERSON` accepts."""
    import json

    try:
        v = json.loads(text or "")
    except ValueError:
        return False
    if not isinstance(v, dict) or set(v) != {"name", "age"}:
        return False
    name, age = v["name"], v["age"]
    return isinstance(name, str) and len(name) <= 20 and type(age) is int and 0 <= age <= 120


def is_weather_call(message) -> bool:
    """Whether the reply is one call of get_weather whose arguments parse and fit."""
    import json

    calls = message.tool_calls or []
    if len(calls) != 1 or calls[0].function.name != "get_weather":
        return False
    try:
        args = json.loads(calls[0].function.arguments)
    except ValueError:
        return False
    return set(args) == {"city"} and isinstance(args["city"], str) and len(args["city"]) <= 20


def broken_call(message) -> bool:
    """Whether a reply began a tool call that does not parse as one of get_weather (a
    text answer is not broken)."""
    text = (message.content or "").lstrip()
    if not message.tool_calls and not text.startswith(("{", "<tool_call>")):
        return False
    return not is_weather_call(message)


def streamed_message(api, **kw):
    """The message the openai SDK's stream helper accumulates from a streamed reply."""
    with api.chat.completions.stream(**kw) as stream:
        for _ in stream:
            pass
        return stream.current_completion_snapshot.choices[0].message


def structured(cfg, model: str, requests: int, tokens: int) -> dict[str, tuple[int, int]]:
    """(failures, requests) per kind: JSON replies and tool calls, constrained (the
    schema as response_format; tools offered, the reply constrained to text or calls)
    and free (asked in words, nothing constrained), tool calls streamed and not. A
    forced call fails unless it is one call of get_weather that parses; an `auto` or
    free reply fails only if it began a call that does not parse."""
    from openai import OpenAI

    with served(cfg, model) as server:
        api = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
        ask_json = "Reply with only JSON: an object with a name (string) and an age (integer)"
        kinds = ("json constrained", "json free", "tool required", "tool required, streamed",
                 "tool auto", "tool auto, streamed", "tool free (asked in words)")  # fmt: skip
        counts = dict.fromkeys(kinds, 0)
        in_words = (
            "You can call get_weather(city). To call it, reply with only a JSON object "
            '{"name": "get_weather", "arguments": {"city": <the city>}}.'
        )
        for i in range(requests):
            who = f"{ask_json} for person number {i}."
            kw = dict(model=model, max_tokens=tokens, temperature=0.7, seed=i)
            chat = partial(api.chat.completions.create, **kw)
            msgs = [{"role": "user", "content": who}]
            counts["json constrained"] += not is_person(
                chat(messages=msgs, response_format=fmt).choices[0].message.content
            )
            counts["json free"] += not is_person(chat(messages=msgs).choices[0].message.content)
            where = [{"role": "user", "content": f"What is the weather in {CITIES[i % 8]}?"}]
            for choice, stream in (("required", False), ("required", True), ("auto", False),
                                   ("auto", True)):  # fmt: skip
                ask = dict(messages=where, tools=[WEATHER], tool_choice=choice,
                           parallel_tool_calls=False)  # fmt: skip
                message = streamed_message(api, **kw, **ask) if stream else (
                    chat(**ask).choices[0].message)  # fmt: skip
                kind = f"tool {choice}" + (", streamed" if stream else "")
                counts[kind] += (not is_weather_call(message)) if choice == "required" else (
                    broken_call(message))  # fmt: skip
            words = [{"role": "system", "content": in_words}, *where]
            counts["tool free (asked in words)"] += broken_call(
                _as_call(chat(messages=words).choices[0].message)
            )
    return {k: (v, requests) for k, v in counts.items()}


def _as_call(message):
    """A free reply read as the server would read a call: its text parsed as one."""
    from types import SimpleNamespace

    from corps.engine.request.tools import JSON_CALLS, parse

    _, calls = parse(JSON_CALLS, (message.content or "").lstrip())
    tool_calls = [SimpleNamespace(function=SimpleNamespace(name=c.name, arguments=c.arguments))
                  for c in calls if c.complete]  # fmt: skip
    return SimpleNamespace(content=message.content, tool_calls=tool_calls or None)


def flow_table(flows: list[Flow], title: str):
    from rich.table import Table

    t = Table(title=title)
    for col in ("variant", "wall", "mean TTFT", "tokens encoded", "tokens reused"):
        t.add_column(col, justify="right")
    for f in flows:
        t.add_row(f.variant, f"{f.wall_s:.2f} s", f"{statistics.fmean(f.ttft_s) * 1000:.0f} ms",
                  str(f.tokens_encoded), str(f.tokens_reused))  # fmt: skip
    return t


def structured_table(counts: dict[str, tuple[int, int]], title: str):
    from rich.table import Table

    t = Table(title=title)
    for col in ("replies", "parse failures", "of"):
        t.add_column(col, justify="right")
    for kind, (bad, n) in counts.items():
        t.add_row(kind, str(bad), str(n))
    return t
