"""`corps bench gpu`: the GPU figures of one model in one run, side by side.

Sections, each measured in the same process on the same device and dtype, each
written as a JSON line to `--out` as soon as it is done (a run cut short keeps
what it measured), each failure reported and counted (the command exits 1 if
any section failed):

- prefill: one long prompt, corps' `prefill` against HF's forward; and many
  short spans over one shared context (`prefill_many` of spans whose parent is
  the context) against HF's forward of the same spans over a cache of the
  context repeated for each (equal work: neither re-encodes the context).
- decode, one stream: corps' `decode` against HF `generate` (both as
  (N - 1) / (t(N) - t(1)) tokens/s) and against the bound of the weights read
  once per token at the copy bandwidth measured on the device.
- decode, many streams: `decode_many` of S streams against HF `generate` of a
  batch of S (tokens sampled per second).
- graphs: when the engine runs decode steps through static buffers (`--graphs`,
  CUDA graphs by default on a GPU), one stream and the first stream count again
  on an engine with graphs="off": what the graphs are worth.
- workflows: choreographed against the prefix-cached baseline on equal work
  (`corps.cli.bench.workflow.measure`): wall and mean TTFT ratios.

On the GPU the clock is read after `torch.cuda.synchronize()`. On a CPU the
same sections run (tiny sizes rehearse the command; the figures mean little).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from corps.cli.bench.runner import random_ids

#: workflows and their settings: the paper's three, and tree of thoughts 8x8
WORKFLOWS: dict[str, tuple[str, dict]] = {
    "debate": ("debate", dict(rounds=3)),
    "tree_of_thoughts": ("tree_of_thoughts", dict(branches=8, voters=4)),
    "parallel_debate": ("parallel_debate", dict(agents=3, rounds=3)),
    "tree_of_thoughts_8x8": ("tree_of_thoughts", dict(branches=8, voters=8)),
}


@dataclass
class Figure:
    """One measured line: corps' figure, the reference's, and corps / reference."""

    section: str
    name: str
    corps: float
    reference: float
    unit: str
    note: str = ""
    ratio: float = field(init=False)

    def __post_init__(self) -> None:
        self.ratio = self.corps / self.reference if self.reference else math.nan


@dataclass(frozen=True)
class Settings:
    model: str
    dtype: str
    device: str
    prompt_tokens: int = 2048
    spans: int = 16
    span_tokens: int = 128
    context_tokens: int = 1024
    decode_tokens: int = 128
    streams: tuple[int, ...] = (16, 64)
    stream_tokens: int = 64
    workflows: tuple[str, ...] = tuple(WORKFLOWS)
    workflow_tokens: int = 64
    runs: int = 2
    repeats: int = 3
    graphs: str = "auto"  # EngineConfig.graphs of the measured engine


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


async def timed(device: str, fn: Callable[[], Awaitable[Any]], repeats: int) -> float:
    """Best seconds of `repeats` awaits of fn(), the device synchronised around each."""
    best = math.inf
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        await fn()
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def copy_bandwidth(device: str, mib: int = 256, repeats: int = 5) -> float:
    """Bytes moved per second (read + written) by a copy of `mib` MiB on the device."""
    src = torch.empty(mib << 20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    best = math.inf
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.numel() / best


class HFReference:
    """The same model in transformers (the same weights for a dummy model), on the device."""

    def __init__(self, path: Path, dtype: torch.dtype, device: str) -> None:
        from transformers import AutoTokenizer

        from corps.engine import load_hf

        self.device = device
        self.model = load_hf(path, dtype=dtype, device=device).to(device).eval()
        self.tok = AutoTokenizer.from_pretrained(str(path))
        self.vocab = self.model.config.vocab_size

    def ids(self, rows: int, cols: int) -> torch.Tensor:
        return torch.tensor([random_ids(self.vocab, cols) for _ in range(rows)], device=self.device)

    async def forward(self, ids: torch.Tensor, cache=None) -> None:
        with torch.inference_mode():
            self.model(ids, past_key_values=cache, use_cache=cache is not None)

    def cache_of(self, context: torch.Tensor, copies: int):
        """The KV cache of `context` (1, C), repeated for a batch of `copies`."""
        with torch.inference_mode():
            cache = self.model(context, use_cache=True).past_key_values
        cache.batch_repeat_interleave(copies)
        return cache

    async def generate(self, batch: int, tokens: int) -> None:
        ids = self.ids(batch, 16)
        with torch.inference_mode():
            self.model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens,
                min_new_tokens=tokens, do_sample=False, pad_token_id=self.tok.eos_token_id,
            )  # fmt: skip


async def prefill_figures(engine, hf: HFReference, s: Settings) -> list[Figure]:
    dev, out = s.device, []
    ids = random_ids(hf.vocab, s.prompt_tokens)
    mine = await timed(dev, lambda: _prefill_free(engine, ids), s.repeats)
    ref = await timed(dev, lambda: hf.forward(torch.tensor([ids], device=dev)), s.repeats)
    out.append(Figure("prefill", f"one prompt of {s.prompt_tokens}", s.prompt_tokens / mine,
                      s.prompt_tokens / ref, "tok/s"))  # fmt: skip
    context = random_ids(hf.vocab, s.context_tokens)
    ctx = await engine.prefill(context, frame=False)
    spans = [random_ids(hf.vocab, s.span_tokens) for _ in range(s.spans)]
    requests = [dict(message=x, frame=False, parents=[ctx]) for x in spans]

    async def ours() -> None:
        for h in await engine.prefill_many(requests):
            engine.free(h)

    mine = await timed(dev, ours, s.repeats)
    engine.free(ctx)
    batch = torch.tensor(spans, device=dev)  # (S, R)
    best = math.inf
    for _ in range(s.repeats):  # the cache is made anew (untimed): a forward extends it
        cache = hf.cache_of(torch.tensor([context], device=dev), s.spans)
        best = min(best, await timed(dev, lambda c=cache: hf.forward(batch, c), 1))
    rows = s.spans * s.span_tokens
    name = f"{s.spans} spans of {s.span_tokens} over {s.context_tokens} shared"
    out.append(Figure("prefill", name, rows / mine, rows / best, "tok/s"))
    return out


async def _prefill_free(engine, ids: list[int]) -> None:
    engine.free(await engine.prefill(ids, frame=False))


async def decode_figures(engine, hf: HFReference, s: Settings) -> list[Figure]:
    dev, n = s.device, s.decode_tokens
    q = await engine.prefill(random_ids(hf.vocab, 16), frame=False)

    async def ours(k: int) -> None:
        engine.free(await engine.decode(parents=[q], max_tokens=k, ignore_eos=True))

    t_n, t_1 = [await timed(dev, lambda k=k: ours(k), s.repeats) for k in (n, 1)]
    h_n, h_1 = [await timed(dev, lambda k=k: hf.generate(1, k), s.repeats) for k in (n, 1)]
    engine.free(q)
    mine, ref = (n - 1) / (t_n - t_1), (n - 1) / (h_n - h_1)
    bound = copy_bandwidth(dev) / engine.stats().weight_bytes
    name = f"one stream, {n} tokens"
    bound_note = "reference: weight bytes / measured copy bandwidth"
    return [
        Figure("decode", name, mine, ref, "tok/s", "reference: HF generate"),
        Figure("decode", name + " (of the bound)", mine, bound, "tok/s", bound_note),
    ]


async def stream_figures(engine, hf: HFReference, s: Settings) -> list[Figure]:
    out, q = [], await engine.prefill(random_ids(hf.vocab, 16), frame=False)
    for n in s.streams:
        many = [dict(parents=[q], max_tokens=s.stream_tokens, ignore_eos=True, seed=i,
                     temperature=0.7) for i in range(n)]  # fmt: skip

        async def ours(many=many) -> None:
            for h in await engine.decode_many(many):
                engine.free(h)

        mine = await timed(s.device, ours, s.repeats)
        ref = await timed(s.device, lambda n=n: hf.generate(n, s.stream_tokens), s.repeats)
        tokens = n * s.stream_tokens
        out.append(Figure("streams", f"{n} streams x {s.stream_tokens}", tokens / mine,
                          tokens / ref, "tok/s", "reference: HF generate, batch"))  # fmt: skip
    engine.free(q)
    return out


async def graph_figures(s: Settings, hf: HFReference, measured: list[Figure]) -> list[Figure]:
    """One stream and the first stream count on an engine with graphs="off", against
    the figures `measured` with the settings' graphs."""
    from corps.engine import Engine

    eager_s = Settings(**{**asdict(s), "streams": s.streams[:1], "graphs": "off"})
    async with Engine.open(s.model, dtype=s.dtype, device=s.device, graphs="off") as engine:
        eager = await decode_figures(engine, hf, eager_s) + await stream_figures(
            engine, hf, eager_s
        )
    with_graphs = {(f.section, f.name): f.corps for f in measured}
    note = f"reference: graphs='off' (measured: graphs={s.graphs!r})"
    return [
        Figure("graphs", f.name, with_graphs[(f.section, f.name)], f.corps, f.unit, note)
        for f in eager
        if (f.section, f.name) in with_graphs and "bound" not in f.name
    ]


def release(device: str) -> None:
    """Give cached device memory back before the next engine sizes its store."""
    import gc

    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


async def workflow_figures(s: Settings) -> list[Figure]:
    from corps.cli.bench.workflow import measure
    from corps.patterns.samples import MATH_PROBLEMS

    out = []
    for name in s.workflows:
        pattern, params = WORKFLOWS[name]
        params = {**params, "max_tokens": s.workflow_tokens}
        report = await measure(
            pattern, params, model=s.model, impls=("baseline", "choreographed"),
            runs=s.runs, dtype=s.dtype, device=s.device, questions=[q for q, _ in MATH_PROBLEMS],
        )  # fmt: skip
        r = report.ratios["baseline/choreographed"]
        for metric, label in (("wall_s", "wall"), ("ttft_s", "mean TTFT")):
            ci = f"95% CI {r[metric].low:.2f}-{r[metric].high:.2f}"
            note = f"{ci}, equal work: {report.equal_work}"
            title = f"{name}: baseline / choreographed {label}"
            out.append(Figure("workflows", title, r[metric].mean, 1.0, "x", note))
    return out


async def run(s: Settings, out: Path | None, console: Console) -> tuple[list[Figure], list[str]]:
    """Every section; (figures, failures). Each section's lines go to `out` at once."""
    from corps.engine import Engine, torch_dtype

    figures: list[Figure] = []
    failures: list[str] = []

    def keep(section: str, got: list[Figure] | BaseException) -> None:
        if isinstance(got, BaseException):
            failures.append(f"{section}: {got!r}")
            console.print(f"[bold red]{section} failed:[/] {got!r}")
            line = {"section": section, "error": repr(got)}
            rows = [line]
        else:
            figures.extend(got)
            rows = [asdict(f) for f in got]
        if out is not None:
            with out.open("a") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)

    async with Engine.open(s.model, dtype=s.dtype, device=s.device, graphs=s.graphs) as engine:
        hf = HFReference(engine.model_path, torch_dtype(s.dtype), s.device)
        for section, fn in (("prefill", prefill_figures), ("decode", decode_figures),
                            ("streams", stream_figures)):  # fmt: skip
            try:
                keep(section, await fn(engine, hf, s))
            except Exception as exc:  # a failing section is reported; the others run
                keep(section, exc)
        static = engine.stats().static_steps
    release(s.device)
    if static:  # the steps ran through static buffers: against the same steps eager
        try:
            keep("graphs", await graph_figures(s, hf, figures))
        except Exception as exc:
            keep("graphs", exc)
        release(s.device)
    del hf
    release(s.device)
    try:
        keep("workflows", await workflow_figures(s))
    except Exception as exc:
        keep("workflows", exc)
    return figures, failures


def table(s: Settings, figures: list[Figure]) -> Table:
    t = Table(title=f"corps on {s.device} ({s.model}, {s.dtype})")
    for col in ("section", "figure", "corps", "reference", "corps / reference", "note"):
        t.add_column(col, justify="right" if col in ("corps", "reference") else "left")
    for f in figures:
        t.add_row(f.section, f.name, f"{f.corps:,.1f} {f.unit}", f"{f.reference:,.1f} {f.unit}",
                  f"{f.ratio:.2f}x", f.note)  # fmt: skip
    return t


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    import platform

    return platform.processor() or platform.machine()
