"""`corps bench gpu`: the GPU figures of one model in one run, side by side.

Sections, each measured in the same process on the same device and dtype, each
written as a JSON line to `--out` as soon as it is done (a run cut short keeps
what it measured), each failure reported and counted (the command exits 1 if
any section failed):

- prefill: one long prompt, corps' `prefill` against HF's forward (the last
  position's logits only, as corps' prefill computes none); and many
  short spans over one shared context (`prefill_many` of spans whose parent is
  the context) against HF's forward of the same spans over a cache of the
  context repeated for each (equal work: neither re-encodes the context).
- decode, one stream: corps' `decode` against HF `generate` (both as
  (N - 1) / (t(N) - t(1)) tokens/s) and against the bound of the weights read
  once per token at the copy bandwidth measured on the device.
- decode, many streams: `decode_many` of S streams against HF `generate` of a
  batch of S (tokens sampled per second).
- profile: the device's busy time against the wall time, and the kernels
  launched, for the long prompt's prefill and the decode of one and of the
  first stream count (torch.profiler): how host-bound each is.
- graphs: when the engine runs decode steps through static buffers (`--graphs`,
  CUDA graphs by default on a GPU), one stream and the first stream count again
  on an engine with graphs="off": what the graphs are worth.
- patterns: every built-in pattern once with its default settings (but the
  decode budget `workflow_tokens`) in both modes, one engine per mode: that
  each runs on this model and device, and its wall time choreographed against
  the baseline's (not equal work: each mode samples its own tokens).
- memory: `engines` engines opened at the default sizing (the store takes
  `memory_fraction` of what the weights leave free) and closed in sequence; the
  device memory still allocated after each close against what it held open.
- workflows: choreographed against the prefix-cached baseline on equal work
  (`corps.bench.workflow.measure`): wall and mean TTFT ratios.
- account (last): where each built-in pattern's time goes, phase by phase, in both
  modes on equal work (`corps.bench.account`): device time per phase from CUDA
  events, the kernels the profiler saw launched per phase beside the op counter's
  count of the same run (the CPU's proxy); a table per pattern, a JSON line per
  pattern and mode, and as figures each pattern's wall, TTFT and launches
  choreographed against the baseline.

Every engine but the memory section's is opened with `memory_budget` (when
set), so that an engine and transformers' copy of a large model, or two
engines of it, fit on one device together.

On the GPU the clock is read after `torch.cuda.synchronize()`. On a CPU the
same sections run (tiny sizes rehearse the command; the figures mean little).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from corps.bench.gpu_figures import Figure, Settings, release, sync, timed
from corps.bench.gpu_workflows import account_figures, pattern_figures, workflow_figures
from corps.bench.runner import random_ids


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

        from corps.engine.model.weights import load_hf

        self.device = device
        self.model = load_hf(path, dtype=dtype, device=device).to(device).eval()
        self.tok = AutoTokenizer.from_pretrained(str(path))
        self.vocab = self.model.config.vocab_size

    def ids(self, rows: int, cols: int) -> torch.Tensor:
        return torch.tensor([random_ids(self.vocab, cols) for _ in range(rows)], device=self.device)

    async def forward(self, ids: torch.Tensor, cache=None) -> None:
        """A prefill as corps runs one: the logits of each row's last position only
        (`logits_to_keep=1`), not the vocabulary at every position."""
        with torch.inference_mode():
            self.model(ids, past_key_values=cache, use_cache=cache is not None, logits_to_keep=1)

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
    mine, ref = per_token(n - 1, t_n, t_1), per_token(n - 1, h_n, h_1)
    bound = copy_bandwidth(dev) / engine.stats().weight_bytes
    name = f"one stream, {n} tokens"
    bound_note = "reference: weight bytes / measured copy bandwidth"
    noisy = not (math.isfinite(mine) and math.isfinite(ref))
    return [
        Figure("decode", name, mine, ref, "tok/s", NOISE if noisy else "reference: HF generate"),
        Figure("decode", name + " (of the bound)", mine, bound, "tok/s",
               NOISE if noisy else bound_note),
    ]  # fmt: skip


#: the note of a decode figure (NaN) whose two timings' difference was not above the
#: timer's noise: not a failure of the engine, so the command does not fail on it
NOISE = "timing noise: decoding n tokens took no longer than 1; raise --decode-tokens or --repeats"


def per_token(tokens: int, t_n: float, t_1: float) -> float:
    """Tokens a second from the time of a decode of n tokens less that of one (the
    per-call costs cancel); NaN when the difference is not positive (a tiny model or a
    busy machine: below the timer's noise), rather than a negative or infinite rate."""
    return tokens / (t_n - t_1) if t_n > t_1 else math.nan


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


async def profile_figures(engine, hf: HFReference, s: Settings) -> list[Figure]:
    """Where a step's time goes: the device's busy time (its kernels' summed time, from
    torch.profiler) against the wall time, and the kernels launched, for the long
    prompt's prefill, one stream's decode and the first stream count's decode. A busy
    share well below 1 is a host-bound (launch- or Python-bound) step."""
    from torch.profiler import ProfilerActivity, profile

    vocab, n = hf.vocab, s.stream_tokens
    q = await engine.prefill(random_ids(vocab, 16), frame=False)

    async def prefill() -> None:
        await _prefill_free(engine, random_ids(vocab, s.prompt_tokens))

    async def decode(streams: int) -> None:
        many = [dict(parents=[q], max_tokens=n, ignore_eos=True, seed=i) for i in range(streams)]
        for h in await engine.decode_many(many):
            engine.free(h)

    work = [(f"prefill of {s.prompt_tokens}", prefill)]
    work += [(f"decode, {k} stream(s) x {n}", lambda k=k: decode(k)) for k in (1, s.streams[0])]
    cuda = s.device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    out = []
    for name, fn in work:
        await fn()  # warm: captures and compiles are not the steady state
        sync(s.device)
        with profile(activities=activities) as prof:
            t0 = time.perf_counter()
            await fn()
            sync(s.device)
            wall = time.perf_counter() - t0
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        busy = sum(getattr(e, "device_time", 0) or 0 for e in kernels) / 1e6  # us -> s
        note = f"reference: wall time; {len(kernels)} kernels"
        out.append(Figure("profile", f"{name}: device busy", busy * 1e3, wall * 1e3, "ms", note))
    engine.free(q)
    return out


async def graph_figures(s: Settings, hf: HFReference, measured: list[Figure]) -> list[Figure]:
    """One stream and the first stream count on an engine with graphs="off", against
    the figures `measured` with the settings' graphs."""
    from corps.engine import Engine

    eager_s = Settings(**{**asdict(s), "streams": s.streams[:1], "graphs": "off"})
    async with Engine.open(s.model, graphs="off", **s.engine_kw()) as engine:
        eager = await decode_figures(engine, hf, eager_s) + await stream_figures(
            engine, hf, eager_s
        )
    with_graphs = {(f.section, f.name): f.corps for f in measured}
    notes = {(f.section, f.name): f.note for f in measured}
    note = f"reference: graphs='off' (measured: graphs={s.graphs!r})"
    return [
        Figure("graphs", f.name, with_graphs[(f.section, f.name)], f.corps, f.unit,
               NOISE if NOISE in (f.note, notes[(f.section, f.name)]) else note)
        for f in eager
        if (f.section, f.name) in with_graphs and "bound" not in f.name
    ]  # fmt: skip


def allocated(device: str) -> int:
    """Bytes of device memory torch holds in tensors (0 on a CPU: not tracked)."""
    return torch.cuda.memory_allocated(torch.device(device)) if device.startswith("cuda") else 0


async def memory_figures(s: Settings) -> list[Figure]:
    """`s.engines` engines at the default sizing, opened and closed in sequence: the
    memory each leaves allocated after its close (over before the first opened)
    against what it held open. A leak fails the next open for want of memory."""
    from corps.engine import Engine

    before, out = allocated(s.device), []
    for i in range(s.engines):
        async with Engine.open(
            s.model, dtype=s.dtype, device=s.device, weights=s.weights
        ) as engine:
            await _prefill_free(engine, random_ids(engine.tokenizer.vocab_size, 64))
            held = allocated(s.device) - before
        release(s.device)
        left = allocated(s.device) - before
        name = f"engine {i + 1} of {s.engines}: left after close"
        note = "reference: held while open"
        out.append(Figure("memory", name, left / 2**20, held / 2**20, "MiB", note))
    return out


async def run(s: Settings, out: Path | None, console: Console) -> tuple[list[Figure], list[str]]:
    """The settings' sections; (figures, failures). Each section's lines go to `out`
    at once."""
    figures: list[Figure] = []
    failures: list[str] = []

    def keep(section: str, got: list[Figure] | BaseException) -> None:
        if isinstance(got, BaseException):
            failures.append(f"{section}: {got!r}")
            console.print(f"[bold red]{section} failed:[/] {got!r}")
            rows = [{"section": section, "error": repr(got)}]
        else:
            figures.extend(got)
            failures.extend(f"{section}: {f.name}: {f.error}" for f in got if f.error)
            rows = [asdict(f) for f in got]
        if out is not None:
            with out.open("a") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)

    async def section(name: str, fn: Callable[..., Awaitable[list[Figure]]], *args) -> None:
        if name in s.sections:
            try:
                keep(name, await fn(*args))
            except Exception as exc:  # a failing section is reported; the others run
                keep(name, exc)

    measured = ("prefill", "decode", "streams", "profile", "graphs")
    if any(x in s.sections for x in measured):
        try:
            hf, static = await _measured_engine(s, section)
        except Exception as exc:  # the engine or transformers' copy did not load
            keep("engine", exc)
            hf, static = None, 0
        release(s.device)
        if static:  # the steps ran through static buffers: against the same steps eager
            await section("graphs", graph_figures, s, hf, figures)
        del hf
        release(s.device)
    await section("patterns", pattern_figures, s)
    await section("memory", memory_figures, s)
    await section("workflows", workflow_figures, s)
    await section("account", account_figures, s, out, console)  # the longest, last
    return figures, failures


async def _measured_engine(s: Settings, section) -> tuple[HFReference, int]:
    """The prefill, decode and streams sections on one engine (transformers' copy
    loaded beside it); (that copy, the engine's static decode steps)."""
    from corps.engine import Engine
    from corps.engine.model.weights import torch_dtype

    async with Engine.open(s.model, graphs=s.graphs, **s.engine_kw()) as engine:
        hf = HFReference(engine.model_path, torch_dtype(s.dtype), s.device)
        await section("prefill", prefill_figures, engine, hf, s)
        await section("decode", decode_figures, engine, hf, s)
        await section("streams", stream_figures, engine, hf, s)
        await section("profile", profile_figures, engine, hf, s)
        return hf, engine.stats().static_steps


def table(s: Settings, figures: list[Figure]) -> Table:
    t = Table(title=f"corps on {s.device} ({s.model}, {s.dtype}, weights {s.weights})")
    for col in ("section", "figure", "corps", "reference", "corps / reference", "note"):
        t.add_column(col, justify="right" if col in ("corps", "reference") else "left")
    for f in figures:
        t.add_row(f.section, f.name, f"{f.corps:,.1f} {f.unit}", f"{f.reference:,.1f} {f.unit}",
                  f"{f.ratio:.2f}x", f"failed: {f.error}" if f.error else f.note)  # fmt: skip
    return t


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    import platform

    return platform.processor() or platform.machine()
