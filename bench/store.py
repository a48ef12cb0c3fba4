"""`corps bench store`: what a store (`EngineConfig.store`) costs and what it saves.

Restart: `contexts` prompts of `tokens` tokens each are encoded in an engine on a
store, which is closed (its encodings saved). Then a follow-up call over each is
timed (to its first token) in three engines: reopened on the store with its
encodings (copied in), reopened after the encoding files are deleted (each context
encoded again from its tokens when read: what a killed process leaves), and a
fresh engine without a store that encodes the contexts' text again first (what a
restart costs without one). Tier: a store too small for every context; reading
them back in turn evicts others; with a store, evicted encodings are saved and
copied back, without one they are recomputed: wall time and tokens of each.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel
from rich.table import Table

from corps.cache.durable import KV
from corps.engine import Engine

TEXT = "The committee reviewed the quarterly figures and the plan for the next year. "


class Restart(BaseModel):
    label: str
    open_s: float  # opening the engine (the store read back)
    follow_s: float  # the follow-ups, to their first tokens, all together
    encoded: int  # tokens the model ran in the follow-ups (contexts included)
    copied: int  # context tokens copied back from the store


class Tier(BaseModel):
    label: str
    wall_s: float
    evicted: int
    recomputed: int
    copied: int


def _context(engine: Engine, tokens: int, i: int) -> str:
    """A text of about `tokens` tokens, different per context."""
    per = max(1, len(engine.tokenizer.encode(TEXT)))
    return f"Document {i}. " + TEXT * max(1, tokens // per)


async def restart(model: str, contexts: int, tokens: int, dtype: str) -> list[Restart]:
    """The three restarts of the module doc, in one run."""
    root = Path(tempfile.mkdtemp(prefix="corps-bench-store-"))
    try:
        async with Engine.open(model, dtype=dtype, store=root / "s") as engine:
            ids = [(await engine.prefill(_context(engine, tokens, i))).id for i in range(contexts)]
        out = [await _follow("encodings copied in", model, dtype, root / "s", ids)]
        shutil.copytree(root / "s", root / "lost")
        for f in (root / "lost" / KV).iterdir():
            f.unlink()
        out.append(await _follow("encodings lost", model, dtype,
                                 root / "lost", ids))  # fmt: skip
        out.append(await _fresh(model, dtype, contexts, tokens))
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def _follow(label: str, model: str, dtype: str, store: Path, ids: list[int]) -> Restart:
    t0 = time.perf_counter()
    async with Engine.open(model, dtype=dtype, store=store) as engine:
        opened = time.perf_counter() - t0
        before = engine.stats()
        t1 = time.perf_counter()
        for i in ids:
            await engine.decode(parents=[engine.handle(i)], max_tokens=1, final=True)
        wall = time.perf_counter() - t1
        s = engine.stats()
    copied = s.tokens_copied_back
    return Restart(label=label, open_s=opened, follow_s=wall,
                   encoded=s.tokens_encoded - before.tokens_encoded, copied=copied)  # fmt: skip


async def _fresh(model: str, dtype: str, contexts: int, tokens: int) -> Restart:
    """No store: the contexts' text encoded again, then the same follow-ups."""
    t0 = time.perf_counter()
    async with Engine.open(model, dtype=dtype) as engine:
        opened = time.perf_counter() - t0
        t1 = time.perf_counter()
        for i in range(contexts):
            ctx = await engine.prefill(_context(engine, tokens, i))
            await engine.decode(parents=[ctx], max_tokens=1, final=True)
        wall = time.perf_counter() - t1
        encoded = engine.stats().tokens_encoded
    return Restart(label="no store", open_s=opened, follow_s=wall,
                   encoded=encoded, copied=0)  # fmt: skip


async def tier(model: str, contexts: int, tokens: int, dtype: str) -> list[Tier]:
    """Reading `contexts` contexts back in turn through a store that holds about half."""
    root = Path(tempfile.mkdtemp(prefix="corps-bench-tier-"))
    try:
        out = []
        async with Engine.open(model, dtype=dtype) as probe:
            per = len(probe.tokenizer.encode(_context(probe, tokens, 0)))
        capacity = max(256, per * contexts // 2 + 2 * per)
        for label, store in (("no store", None), ("store", root)):
            async with Engine.open(model, dtype=dtype, store=store, capacity=capacity) as e:
                hs = [await e.prefill(_context(e, tokens, i)) for i in range(contexts)]
                t0 = time.perf_counter()
                for h in hs * 2:
                    await e.decode(parents=[h], max_tokens=1, final=True)
                s = e.stats()
                out.append(Tier(label=label, wall_s=time.perf_counter() - t0,
                                evicted=s.tokens_evicted, recomputed=s.tokens_recomputed,
                                copied=s.tokens_copied_back))  # fmt: skip
            shutil.rmtree(root, ignore_errors=True)
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def tables(restarts: list[Restart], tiers: list[Tier]) -> list[Table]:
    t = Table(title="after a restart: a follow-up over each context, to its first token")
    for col in ("engine", "open s", "follow-ups s", "tokens encoded", "tokens copied", "vs copied"):
        t.add_column(col, justify="left" if col == "engine" else "right")
    base = restarts[0].follow_s
    for r in restarts:
        t.add_row(r.label, f"{r.open_s:.2f}", f"{r.follow_s:.3f}", str(r.encoded),
                  str(r.copied), f"{r.follow_s / base:.2f}x")  # fmt: skip
    u = Table(title="evicted encodings read back: recomputed vs copied from the store")
    for col in ("memory", "wall s", "tokens evicted", "recomputed", "copied back", "vs store"):
        u.add_column(col, justify="left" if col == "memory" else "right")
    store = tiers[-1].wall_s
    for r in tiers:
        u.add_row(r.label, f"{r.wall_s:.3f}", str(r.evicted), str(r.recomputed), str(r.copied),
                  f"{r.wall_s / store:.2f}x")  # fmt: skip
    return [t, u]
