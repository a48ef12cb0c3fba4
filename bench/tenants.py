"""`corps bench tenants`: one tenant's latency beside another tenant's load, over HTTP.

Two tenants of one `corps serve` (a key file with a key each, their weights the
file's): a *light* tenant sending one streamed chat request at a time, and a
*heavy* tenant keeping `streams` streamed requests going (closed loop: each
stream sends its next request when its reply ends). For each server setting
(mode and scheduling policy, a fresh server each) three phases run in turn:

- light alone: its requests one after another (its solo TTFT);
- heavy alone for as long: its solo throughput;
- together: the heavy streams going (each past its first reply) while the
  light tenant sends the same requests again.

Reported per setting: the light tenant's TTFT p50 / p99 alone and together and
their ratios, the heavy tenant's completion tokens per second alone and together,
and both tenants' throughput together against its sum alone. The clients are the
official `openai` async client, in a process of their own (as a server's clients
are: here they would contend with the server for the interpreter lock).
"""

from __future__ import annotations

import math
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

LIGHT_KEY = "sk-bench-light-tenant"
HEAVY_KEY = "sk-bench-heavy-tenant"
LIGHT_PROMPTS = ["What is 7 times 6?", "Name a prime number.", "Say hello.", "Name a colour."]
HEAVY_PROMPT = "Tell me about {} in a few sentences."
TOPICS = ["lighthouses", "dragons", "the sea", "trains", "gardens", "the moon", "robots", "rain"]


@dataclass(frozen=True)
class Plan:
    """One run's workload."""

    streams: int = 40  # the heavy tenant's streams kept going
    requests: int = 30  # the light tenant's requests, one at a time, per phase
    tokens: int = 24  # completion tokens a reply may have (greedy)
    light_weight: float = 1.0
    heavy_weight: float = 1.0
    heavy_s: float = 15.0  # the heavy tenant's solo phase lasts at least this long


@dataclass
class Phase:
    """What one phase measured, per tenant."""

    light_ttft: list[float]  # seconds to the first streamed token, per light request
    seconds: float  # the phase's wall
    heavy_tokens: int  # completion tokens the heavy tenant received in it
    light_tokens: int


@dataclass
class Setting:
    """One server setting's three phases."""

    label: str
    solo: Phase
    heavy_solo: Phase
    together: Phase


def pct(xs: list[float], q: float) -> float:
    """The q-quantile of `xs` (nearest rank)."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def key_file(directory: Path, plan: Plan) -> Path:
    """The bench's key file: one key per tenant, with the plan's weights."""
    path = directory / "keys.toml"
    path.write_text(
        f'[[keys]]\nkey = "{LIGHT_KEY}"\ntenant = "light"\nweight = {plan.light_weight}\n\n'
        f'[[keys]]\nkey = "{HEAVY_KEY}"\ntenant = "heavy"\nweight = {plan.heavy_weight}\n'
    )
    return path


def run_setting(cfg, model: str, label: str, plan: Plan) -> Setting:
    """The three phases against a fresh server over an engine of `cfg`."""
    from corps.bench.http import in_client_process
    from corps.engine import Engine
    from corps.serve.background import BackgroundServer
    from corps.serve.limits import Limits
    from corps.serve.principals import Keys

    with tempfile.TemporaryDirectory() as tmp:
        keys = Keys.load(key_file(Path(tmp), plan))
    limits = Limits(max_queue=max(256, 2 * plan.streams + 8))
    with BackgroundServer(Engine.open(cfg), model=model, keys=keys, limits=limits) as server:
        got = in_client_process(_client_process, (server.url + "/v1", model, plan))
    return Setting(label, *(Phase(*p) for p in got))


def _client_process(url: str, model: str, plan: Plan, results) -> None:
    """The clients' process: the three phases' figures on `results`, or the error."""
    import asyncio

    try:
        results.put(asyncio.run(_phases(url, model, plan)))
    except Exception as exc:  # reported to the parent, which raises it
        results.put(f"{type(exc).__name__}: {exc}")


async def _phases(url: str, model: str, plan: Plan) -> list[tuple]:
    import asyncio

    from openai import AsyncOpenAI

    light = AsyncOpenAI(base_url=url, api_key=LIGHT_KEY, max_retries=0, timeout=600)
    heavy = AsyncOpenAI(base_url=url, api_key=HEAVY_KEY, max_retries=0, timeout=600)
    await _one(light, model, "Say hello.", 2)  # connected and warm before any clock
    await _one(heavy, model, "Say hello.", 2)

    async def light_run(phase: str) -> tuple[list[float], int]:
        ttfts, tokens = [], 0
        for i in range(plan.requests):  # new text each time: nothing found in the store
            prompt = f"{LIGHT_PROMPTS[i % len(LIGHT_PROMPTS)]} ({phase} {i})"
            ttft, n = await _one(light, model, prompt, plan.tokens)
            ttfts.append(ttft)
            tokens += n
        return ttfts, tokens

    t0 = time.perf_counter()
    solo, solo_tokens = await light_run("alone")
    solo_s = time.perf_counter() - t0

    load = _Load(heavy, model, plan)
    await load.start()
    await asyncio.sleep(max(solo_s, plan.heavy_s))  # the heavy tenant alone
    heavy_solo = load.take()
    together, together_tokens = await light_run("together")
    both = load.take()
    await load.stop()
    return [
        (solo, solo_s, 0, solo_tokens),
        ([], heavy_solo[0], heavy_solo[1], 0),
        (together, both[0], both[1], together_tokens),
    ]


class _Load:
    """The heavy tenant's streams, each sending its next request as its reply ends;
    `take()` returns (seconds, completion tokens) since the last take."""

    def __init__(self, api, model: str, plan: Plan) -> None:
        self.api, self.model, self.plan = api, model, plan
        self.tokens, self.since, self.going = 0, 0.0, True
        self.tasks: list = []

    async def start(self) -> None:
        """Every stream going, each past its first reply, before the clock starts."""
        import asyncio

        first = [asyncio.Event() for _ in range(self.plan.streams)]
        self.tasks = [asyncio.create_task(self._stream(s, first[s]))
                      for s in range(self.plan.streams)]  # fmt: skip
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in first)), 600)
        self.take()

    def take(self) -> tuple[float, int]:
        now = time.perf_counter()
        out = (now - self.since, self.tokens)
        self.tokens, self.since = 0, now
        return out

    async def stop(self) -> None:
        import asyncio

        self.going = False
        await asyncio.gather(*self.tasks)

    def got(self, tokens: int) -> None:
        self.tokens += tokens

    async def _stream(self, s: int, first) -> None:
        i = 0
        while self.going:
            prompt = HEAVY_PROMPT.format(TOPICS[(s + i) % len(TOPICS)]) + f" ({s}.{i})"
            await _one(self.api, self.model, prompt, self.plan.tokens, self)
            first.set()
            i += 1


async def _one(api, model: str, prompt: str, tokens: int, load=None) -> tuple[float, int]:
    """One streamed chat request: (seconds to its first content token, completion
    tokens). With `load` (the heavy tenant's), each content chunk counts a token as it
    arrives (the usage chunk corrects the count)."""
    t0 = time.perf_counter()
    ttft, usage, seen = None, 0, 0
    stream = await api.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=tokens,
        temperature=0.0, stream=True, stream_options={"include_usage": True},
    )  # fmt: skip
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            if ttft is None:
                ttft = time.perf_counter() - t0
            seen += 1
            if load is not None:
                load.got(1)
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
    if usage < 1:
        raise RuntimeError("a reply with no tokens")
    if ttft is None:  # its tokens showed no text: the reply's end is when it showed
        ttft = time.perf_counter() - t0
    if load is not None:
        load.got(usage - seen)
    return ttft, usage


def table(settings: list[Setting], title: str):
    from rich.table import Table

    t = Table(title=title)
    for col in ("setting", "light TTFT p50 ms: alone / together (x)",
                "light TTFT p99 ms: alone / together (x)",
                "heavy tok/s: alone / together", "total tok/s together / heavy alone"):  # fmt: skip
        t.add_column(col, justify="right" if col != "setting" else "left")
    for s in settings:
        cells = [s.label]
        for q in (0.5, 0.99):
            a, b = pct(s.solo.light_ttft, q), pct(s.together.light_ttft, q)
            cells.append(f"{a * 1e3:.0f} / {b * 1e3:.0f} ({b / a:.2f}x)")
        h0 = s.heavy_solo.heavy_tokens / s.heavy_solo.seconds
        h1 = s.together.heavy_tokens / s.together.seconds
        total = (s.together.heavy_tokens + s.together.light_tokens) / s.together.seconds
        cells += [f"{h0:.0f} / {h1:.0f}", f"{total / h0:.2f}" if h0 else "-"]
        t.add_row(*cells)
    return t


def summary(s: Setting) -> dict:
    """One setting's figures as a JSON-able dict."""
    return {
        "setting": s.label,
        "light_ttft_p50_s": [pct(s.solo.light_ttft, 0.5), pct(s.together.light_ttft, 0.5)],
        "light_ttft_p99_s": [pct(s.solo.light_ttft, 0.99), pct(s.together.light_ttft, 0.99)],
        "light_ttft_mean_s": [
            statistics.fmean(s.solo.light_ttft),
            statistics.fmean(s.together.light_ttft),
        ],
        "heavy_tok_s": [
            s.heavy_solo.heavy_tokens / s.heavy_solo.seconds,
            s.together.heavy_tokens / s.together.seconds,
        ],
        "light_tok_s_together": s.together.light_tokens / s.together.seconds,
    }


@dataclass
class Shares:
    """Backlogged tenants' service over a window: per tenant its weight, the tokens the
    engine encoded and sampled for it, and its completion tokens."""

    seconds: float
    slots: int
    weights: dict[str, float]
    served: dict[str, float]
    completed: dict[str, int]


async def shares(cfg, weights: dict[str, float], streams: int, tokens: int,
                 seconds: float, slots: int) -> Shares:  # fmt: skip
    """Each tenant of `weights` keeping `streams` decodes going (through the Python API,
    on an engine of `cfg` with the fair policy and `slots` calls running at most, so
    calls wait: a backlog) for `seconds` after a warm-up of a tenth of that: the
    service each received in that window."""
    import anyio

    from corps.engine import Engine

    cfg = cfg.model_copy(update={"policy": "fair", "max_running": slots})
    completed = dict.fromkeys(weights, 0)
    async with Engine.open(cfg) as engine:
        engine.policy.set_weights(weights)
        q = await engine.prefill("Tell me a long story about the sea.")
        counting = False

        async def stream(tenant: str) -> None:
            while True:
                h = await engine.decode(parents=[q], max_tokens=tokens, temperature=0.0,
                                        ignore_eos=True, tenant=tenant)  # fmt: skip
                engine.free(h)
                if counting:
                    completed[tenant] += len(h.generated)

        async with anyio.create_task_group() as tg:
            for tenant in weights:
                for _ in range(streams):
                    tg.start_soon(stream, tenant)
            await anyio.sleep(seconds / 10)  # every tenant backlogged before the clock
            before = {t: f["served"] for t, f in engine.policy.figures().items()}
            counting = True
            await anyio.sleep(seconds)
            after = {t: f["served"] for t, f in engine.policy.figures().items()}
            tg.cancel_scope.cancel()
    served = {t: after.get(t, 0.0) - before.get(t, 0.0) for t in weights}
    return Shares(seconds, slots, dict(weights), served, completed)


def shares_table(s: Shares, title: str):
    from rich.table import Table

    t = Table(title=title)
    for col in ("tenant", "weight", "service (tokens)", "completion tokens",
                "service share", "weight share"):  # fmt: skip
        t.add_column(col, justify="right")
    total_s, total_w = sum(s.served.values()) or 1.0, sum(s.weights.values())
    for tenant, w in s.weights.items():
        t.add_row(tenant, f"{w:g}", f"{s.served[tenant]:.0f}", str(s.completed[tenant]),
                  f"{s.served[tenant] / total_s:.3f}", f"{w / total_w:.3f}")  # fmt: skip
    return t
