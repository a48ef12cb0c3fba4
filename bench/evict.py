"""`corps bench evict`: eviction by workflows' next reads (`Engine.expect`) against LRU.

Many workflows share one KV store too small for all they keep. Each holds a
document its every turn reads; a turn reads a fresh tool output (once: no later
turn reads it) beside the document and the workflow's last reply, and writes a
reply. Half the workflows are agents that take turn after turn; the other half
are people's, each of whose turns waits until every agent took `pace` more (a
person answers slowly). So a person's document was read long ago while the
agents' tool outputs, never to be read again, were read just now: least-recently-
read eviction drops the documents, and each person's next turn brings its
document back. With each workflow saying what its next turn reads
(`engine.expect(doc, reply)`), the dead tool outputs go first, and, with a
store, an expected encoding that had to go anyway is copied back before the
turn that reads it once there is room (prefetch: a finished workflow frees its
messages).

Four runs side by side, each on a fresh engine with the same calls (greedy),
after an untimed warm-up: LRU and expected, without a store (restores
recompute) and with one (restores copy back from disk). "restored" is tokens
recomputed plus tokens copied back. The replies are greedy, but outside float32 a
step's rows decide its kernels' rounding, so runs that batch differently may
reply differently ("replies as LRU's").
"""

from __future__ import annotations

import random
import shutil
import tempfile
import time
from pathlib import Path

import anyio
from pydantic import BaseModel
from rich.table import Table

from corps.engine import Engine

WORDS = "alpha beta gamma delta report figure budget plan river stone cloud signal".split()


class Arm(BaseModel):
    label: str
    wall_s: float
    evicted: int  # tokens whose encodings left the store for room
    recomputed: int
    copied: int  # copied back from the store (prefetched included)
    prefetched: int
    replies: list[str]  # every reply's text, workflow by workflow, turn by turn

    @property
    def restored(self) -> int:
        return self.recomputed + self.copied


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


class Pace:
    """The agents' turns so far, and the people waiting for enough of them."""

    def __init__(self) -> None:
        self.turns = 0
        self.waiting: list[tuple[int, anyio.Event]] = []

    def took(self) -> None:
        self.turns += 1
        for at, ev in self.waiting:
            if self.turns >= at:
                ev.set()

    async def until(self, turns: int) -> None:
        if self.turns < turns:
            ev = anyio.Event()
            self.waiting.append((turns, ev))
            await ev.wait()


async def _workflow(e: Engine, w: int, turns: int, wait: int, pace: Pace, doc: int,
                    tool: int, max_tokens: int, expect: bool, out: list[str]) -> None:  # fmt: skip
    """`turns` turns; with `wait`, turn r waits for (r + 1) x `wait` agents' turns."""
    rng = random.Random(w)  # the same texts in every arm
    with e.workflow(f"w{w}"):
        d = await e.prefill(f"Document {w}: " + _text(rng, doc))
        last, mine = [], [d]
        if expect:
            e.expect(d)
        for r in range(turns):
            if wait:
                await pace.until((r + 1) * wait)
            t = await e.prefill(f"Tool output {r}: " + _text(rng, tool))
            reply = await e.decode(parents=[d, *last, t], max_tokens=max_tokens,
                                   ignore_eos=True)  # fmt: skip
            out.append(reply.text)
            last = [reply]
            mine += [t, reply]
            if expect:
                e.expect(d, reply)  # the next turn reads these; not the tool output
            if not wait:
                pace.took()
        for h in mine:  # done: its memory goes back (room for the others' next reads)
            e.free(h)


async def arm(
    model: str,
    dtype: str,
    capacity: int,
    store: Path | None,
    expect: bool,
    workflows: int,
    rounds: int,
    pace: int,
    sizes: tuple[int, int, int],
) -> Arm:
    """One run: workflows 0, 2, ... are people's (`rounds` turns, paced), 1, 3, ...
    agents' (`rounds` x `pace` turns back to back)."""
    async with Engine.open(model, dtype=dtype, capacity=capacity, store=store) as e:
        outs: list[list[str]] = [[] for _ in range(workflows)]
        agents = max(1, workflows // 2)
        clock = Pace()
        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for w in range(workflows):
                person = w % 2 == 0
                turns, wait = (rounds, pace * agents) if person else (rounds * pace, 0)
                tg.start_soon(_workflow, e, w, turns, wait, clock, *sizes, expect, outs[w])
        wall = time.perf_counter() - t0
        s = e.stats()
        e.check()
    where = "store" if store is not None else "no store"
    return Arm(label=f"{'expected' if expect else 'LRU'}, {where}", wall_s=wall,
               evicted=s.tokens_evicted, recomputed=s.tokens_recomputed,
               copied=s.tokens_copied_back, prefetched=s.tokens_prefetched,
               replies=[x for o in outs for x in o])  # fmt: skip


def store_size(workflows: int, per: int, per_tool: int, max_tokens: int, room: float) -> int:
    """`room` x every document and last reply the workflows keep, plus one turn of each
    in flight (its tool output and reply): calls pin their parents while queued, so
    less could not run them all; the tool outputs that pile up must be evicted."""
    kept = workflows * (per + max_tokens + 16)
    return int(room * kept) + workflows * (per_tool + 2 * (max_tokens + 16)) + 64


async def compare(model: str, dtype: str, workflows: int, rounds: int, pace: int, doc: int,
                  tool: int, max_tokens: int, room: float) -> list[Arm]:  # fmt: skip
    """The four arms of the module doc, after an untimed warm-up (`store_size`)."""
    sizes = (doc, tool, max_tokens)
    async with Engine.open(model, dtype=dtype) as probe:
        per = len(probe.tokenizer.encode(_text(random.Random(0), doc))) + 16
        per_tool = len(probe.tokenizer.encode(_text(random.Random(0), tool))) + 16
    capacity = store_size(workflows, per, per_tool, max_tokens, room)
    root = Path(tempfile.mkdtemp(prefix="corps-bench-evict-"))
    try:
        await arm(model, dtype, capacity, None, True, 2, 1, 1, sizes)  # warm-up, untimed
        out = []
        for store in (None, root / "s"):
            for expect in (False, True):
                if store is not None:
                    shutil.rmtree(store, ignore_errors=True)
                out.append(await arm(model, dtype, capacity, store, expect, workflows,
                                     rounds, pace, sizes))  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return out


def table(arms: list[Arm], capacity_note: str) -> Table:
    t = Table(title=f"eviction by next reads vs LRU ({capacity_note})")
    for col in ("run", "wall s", "evicted", "recomputed", "copied back", "prefetched",
                "restored", "vs LRU restored", "vs LRU wall", "replies as LRU's"):  # fmt: skip
        t.add_column(col, justify="left" if col == "run" else "right")
    for i, a in enumerate(arms):
        lru = arms[i - i % 2]  # the LRU run of the same memory
        ratio = f"{a.restored / lru.restored:.2f}x" if lru.restored else "-"
        t.add_row(a.label, f"{a.wall_s:.2f}", str(a.evicted), str(a.recomputed), str(a.copied),
                  str(a.prefetched), str(a.restored), ratio, f"{a.wall_s / lru.wall_s:.2f}x",
                  "yes" if a.replies == lru.replies else "no")  # fmt: skip
    return t
