"""`corps bench memory`: admission under memory pressure, and what views cost beside the store.

- admission: many concurrent long decodes on a store too small for all of them
  (each caller frees its message when done). Counts calls that failed (target
  0) and calls whose tokens differ from the same call run alone (greedy,
  target 0), with the peak store use. It runs in float32 by default: under
  "mixed" a product's kernel (float16 or bfloat16) follows the step's row count,
  so a batched call may differ from itself alone by 16-bit rounding.
- shared context: the tree-of-thoughts shape, `voters` calls each attending to
  `branches` messages of `branch_tokens` tokens, once per way of holding contexts
  (`Engine.open(contexts=...)`), side by side. Reports the peak KV memory (the
  store's tokens, the views' and the one-layer scratch's) against the store
  tokens those messages need (question, branches and votes; target <= 1.5x), and
  the voters' step time. "copy" holds the shared context once beside the store
  (~2x; a copy per call made it ~voters x); "store" reads it from the store
  (~1x) and pays a rotation per layer at every step.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import anyio
from pydantic import BaseModel

from corps.patterns.samples import DOCUMENT_PARAGRAPHS


class Admission(BaseModel):
    calls: int
    capacity: int
    failed: int
    differing: int
    store_peak: int
    wall_s: float


class LongPrefill(BaseModel):
    decodes: int
    prompt_tokens: int
    chunk_ms: float  # the prompt's costliest chunk (512 tokens) when it runs alone
    decode_step_ms: float  # median step of the decodes alone
    worst_step_ms: float  # longest step while the long prompt was being encoded
    mixed_steps: int  # steps that ran decodes and a prefill chunk together
    prefill_s: float  # the long prompt's wall time, arrival to handle
    finished: bool


class SharedContext(BaseModel):
    contexts: str  # how the engine held them: "copy" or "store"
    branches: int
    voters: int
    store_tokens: int  # what the question, the branches and the votes take in the store
    view_tokens_peak: int  # during the voters' step
    scratch_tokens_peak: int  # during the voters' step; one layer's worth each
    layers: int
    step_s: float  # wall time of the voters' decode_many
    # the whole run's peak, the branches' prefill included: a prefill holds its own
    # tokens in its view while it runs, whichever way contexts are held
    run_view_tokens_peak: int = 0

    @property
    def run_ratio(self) -> float:
        """The whole run's peak KV memory over the store tokens the messages need
        (the branches' own views and the voters' peaks did not overlap in time)."""
        views = max(self.run_view_tokens_peak, self.view_tokens_peak)
        return (self.kv_tokens - self.view_tokens_peak + views) / self.store_tokens

    @property
    def kv_tokens(self) -> float:
        """Peak KV memory in whole-token units (every layer's K and V)."""
        return self.store_tokens + self.view_tokens_peak + self.scratch_tokens_peak / self.layers

    @property
    def ratio(self) -> float:
        """Peak KV memory over the store tokens those messages need."""
        return self.kv_tokens / self.store_tokens


async def admission(
    model: str,
    *,
    calls: int = 64,
    max_tokens: int = 96,
    capacity: int = 2048,
    prompts: int = 4,
    dtype: str = "float32",
) -> Admission:
    from corps.engine import Engine

    async with Engine.open(model, capacity=capacity, dtype=dtype) as engine:
        qs = [await engine.prefill(f"Count slowly from {i} upwards.") for i in range(prompts)]
        alone = []
        for q in qs:
            h = await engine.decode(parents=[q], max_tokens=max_tokens, ignore_eos=True)
            alone.append(h.generated)
            engine.free(h)
        failed, differing, peak = 0, 0, 0

        async def one(i: int) -> None:
            nonlocal failed, differing, peak
            try:
                h = await engine.decode(
                    parents=[qs[i % prompts]], max_tokens=max_tokens, ignore_eos=True
                )
            except Exception:
                failed += 1
                return
            peak = max(peak, engine.stats().tokens_used)
            differing += h.generated != alone[i % prompts]
            engine.free(h)

        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for i in range(calls):
                tg.start_soon(one, i)
        wall = time.perf_counter() - t0
    return Admission(
        calls=calls,
        capacity=capacity,
        failed=failed,
        differing=differing,
        store_peak=peak,
        wall_s=wall,
    )


async def shared_context(
    model: str,
    *,
    branches: int = 16,
    voters: int = 16,
    branch_tokens: int = 256,
    dtype: str = "float32",
    contexts: str = "copy",
) -> SharedContext:
    from corps.engine import Engine

    async with Engine.open(model, dtype=dtype, contexts=contexts) as engine:
        ids = _document(engine, branch_tokens)
        q = await engine.prefill("Which proposal is best?")
        props = await engine.prefill_many(
            [dict(message=ids[i : i + branch_tokens], frame=False) for i in range(branches)]
        )
        run_peak = engine.stats().view_tokens_peak  # the prefills', own tokens all
        engine.reset_peak_stats()
        t0 = time.perf_counter()
        votes = await engine.decode_many(
            [dict(parents=[q, *props], max_tokens=4, ignore_eos=True) for _ in range(voters)]
        )
        step = time.perf_counter() - t0
        stats = engine.stats()
        store = sum(h.length for h in [q, *props, *votes])
        for h in [*votes, *props, q]:
            engine.free(h)
    return SharedContext(
        contexts=contexts,
        branches=branches,
        voters=voters,
        store_tokens=store,
        view_tokens_peak=stats.view_tokens_peak,
        scratch_tokens_peak=stats.scratch_tokens_peak,
        layers=stats.layers,
        step_s=step,
        run_view_tokens_peak=run_peak,
    )


class ContextDecode(BaseModel):
    contexts: str
    context_tokens: int
    calls: int
    max_tokens: int
    wall_s: float  # the calls' decode_many, after a warm-up decode over the same context


async def context_decode(
    model: str,
    *,
    contexts: str = "copy",
    context_tokens: int = 2048,
    calls: int = 1,
    max_tokens: int = 48,
    dtype: str = "float32",
) -> ContextDecode:
    """What reading contexts from the store costs a decode: `calls` decodes of
    `max_tokens` over one `context_tokens`-token message (each step rotates the
    context's keys per layer with contexts="store", reads a copy with "copy")."""
    from corps.engine import Engine

    async with Engine.open(model, dtype=dtype, contexts=contexts) as engine:
        ids = _document(engine, context_tokens)
        q = await engine.prefill(ids[:context_tokens], frame=False)
        engine.free(await engine.decode(parents=[q], max_tokens=4, ignore_eos=True))  # warm up
        reqs = [
            dict(parents=[q], header=f"Reader {i}.", max_tokens=max_tokens, ignore_eos=True)
            for i in range(calls)
        ]
        t0 = time.perf_counter()
        for h in await engine.decode_many(reqs):
            engine.free(h)
        wall = time.perf_counter() - t0
        engine.free(q)
    return ContextDecode(
        contexts=contexts,
        context_tokens=context_tokens,
        calls=calls,
        max_tokens=max_tokens,
        wall_s=wall,
    )


async def long_prefill(
    model: str,
    *,
    decodes: int = 16,
    prompt_tokens: int = 4096,
    max_tokens: int = 96,
    dtype: str = "float32",
) -> LongPrefill:
    """A long prompt arriving while `decodes` calls decode: each step should carry
    the decodes plus at most one chunk of the prompt (read from the trace's steps)."""
    import statistics
    import tempfile
    from pathlib import Path

    from corps.engine import Engine

    step_tokens = 512
    async with Engine.open(model, step_tokens=step_tokens, dtype=dtype) as engine:
        ids = _document(engine, prompt_tokens)
        engine.free(await engine.prefill(ids[:512], frame=False))  # warm up
        # the prompt alone: its costliest chunk (the deepest, attending to the most keys)
        alone_path = Path(tempfile.mkdtemp()) / "alone.jsonl"
        sink = engine.trace_to(alone_path)
        engine.free(await engine.prefill(ids[:prompt_tokens], frame=False))
        engine.end_trace(sink)
        chunk_ms = max(e["dur"] for e in _steps(alone_path)) * 1e3
        qs = [await engine.prefill(f"Count slowly from {i} upwards.") for i in range(decodes)]
        path = alone_path.with_name("steps.jsonl")
        sink = engine.trace_to(path)
        started, out = anyio.Event(), {}

        async def decode(q) -> None:
            async with engine.stream(parents=[q], max_tokens=max_tokens, ignore_eos=True) as st:
                seen = 0
                async for _ in st:
                    seen += 1
                    if seen == 4:
                        started.set()
            engine.free(st.handle)

        async def prompt() -> None:
            await started.wait()
            t = time.perf_counter()
            h = await engine.prefill(ids[:prompt_tokens], frame=False)
            out["s"], out["ok"] = time.perf_counter() - t, h.length == prompt_tokens
            engine.free(h)

        async with anyio.create_task_group() as tg:
            for q in qs:
                tg.start_soon(decode, q)
            tg.start_soon(prompt)
        engine.end_trace(sink)
        for q in qs:
            engine.free(q)
    steps = _steps(path)
    alone = [e["dur"] for e in steps if e["calls"] == decodes and e["sampled"] == decodes]
    mixed = [e["dur"] for e in steps if e["calls"] == decodes + 1]
    return LongPrefill(
        decodes=decodes,
        prompt_tokens=prompt_tokens,
        chunk_ms=chunk_ms,
        decode_step_ms=statistics.median(alone) * 1e3 if alone else 0.0,
        worst_step_ms=max(mixed) * 1e3 if mixed else 0.0,
        mixed_steps=len(mixed),
        prefill_s=out.get("s", 0.0),
        finished=out.get("ok", False),
    )


def _document(engine, tokens: int) -> list[int]:
    """At least `tokens` token ids of the sample document, repeated as needed."""
    ids = engine.tokenizer.encode(" ".join(DOCUMENT_PARAGRAPHS), add_special_tokens=False)
    return ids * -(-tokens // len(ids))


def _steps(path) -> list[dict]:
    """The `step` events of a trace file."""
    import json

    events = [json.loads(line) for line in path.read_text().splitlines()]
    return [e for e in events if e.get("type") == "step"]


def tables(
    adm: Admission,
    ctxs: list[SharedContext],
    long: LongPrefill | None = None,
    decodes: Sequence[ContextDecode] = (),
) -> list[Any]:
    from rich.table import Table

    a = Table(title=f"admission: {adm.calls} long decodes, store of {adm.capacity} tokens")
    for col in ("failed (target 0)", "differ from alone (target 0)", "store peak", "wall"):
        a.add_column(col, justify="right")
    a.add_row(str(adm.failed), str(adm.differing), str(adm.store_peak), f"{adm.wall_s:.1f} s")
    first = ctxs[0]
    c = Table(
        title=f"shared context: {first.voters} calls over {first.branches} messages (tree of "
        "thoughts), per way of holding contexts",
        caption="KV memory: store + views + the one-layer scratch; step: the voters' "
        "decode_many, relative to the first row",
    )
    cols = ("contexts", "store tokens", "peak view tokens", "peak scratch (1 layer)")
    cols = (*cols, "KV memory / store (target <= 1.5)", "whole run, prefills included")
    for col in (*cols, "voters' step", "step / first"):
        c.add_column(col, justify="right")
    for ctx in ctxs:
        c.add_row(
            ctx.contexts,
            str(ctx.store_tokens),
            str(ctx.view_tokens_peak),
            str(ctx.scratch_tokens_peak),
            f"{ctx.ratio:.2f}x",
            f"{ctx.run_ratio:.2f}x",
            f"{ctx.step_s:.2f} s",
            f"{ctx.step_s / first.step_s:.2f}x" if first.step_s else "-",
        )
    out = [a, c]
    if decodes:
        out.append(_decode_table(decodes))
    if long is None:
        return out
    p = Table(
        title=f"a {long.prompt_tokens}-token prompt arriving during {long.decodes} running decodes"
    )
    for col in (
        "decodes' step",
        "worst chunk, prompt alone",
        "worst step with the prompt",
        "worst / (step + chunk)",
        "mixed steps",
        "prompt done",
    ):
        p.add_column(col, justify="right")
    bound = long.decode_step_ms + long.chunk_ms
    p.add_row(
        f"{long.decode_step_ms:.0f} ms",
        f"{long.chunk_ms:.0f} ms",
        f"{long.worst_step_ms:.0f} ms",
        f"{long.worst_step_ms / bound:.2f}" if bound else "-",
        str(long.mixed_steps),
        f"{'yes' if long.finished else 'NO'}, {long.prefill_s:.1f} s",
    )
    return [*out, p]


def _decode_table(decodes: Sequence[ContextDecode]) -> Any:
    from rich.table import Table

    d = Table(
        title="decodes over one long context, contexts copied or read from the store",
        caption="store / copy: what reading contexts from the store costs a decode",
    )
    for col in ("context tokens", "calls", "tokens each", "copy", "store", "store / copy"):
        d.add_column(col, justify="right")
    by = {(r.context_tokens, r.calls, r.contexts): r for r in decodes}
    for n, calls in dict.fromkeys((r.context_tokens, r.calls) for r in decodes):
        copy, store = by[n, calls, "copy"], by[n, calls, "store"]
        d.add_row(
            str(n),
            str(calls),
            str(copy.max_tokens),
            f"{copy.wall_s:.2f} s",
            f"{store.wall_s:.2f} s",
            f"{store.wall_s / copy.wall_s:.2f}x",
        )
    return d
