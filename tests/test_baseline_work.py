"""engine/exec/baseline_work.py: a repair never recomputes more than the baseline would
encode of its call's context, and repairs spend only what choreography saved.

The oracle is a brute-force baseline: every prompt and reply it cached, as token
lists, and each new prompt's hit the longest common prefix with any of them. Random
workflows (hypothesis) of prefills and decodes over random parents, with token
alphabets small enough that messages share prefixes and the cache hits mid-message;
each call asks for a random repair and gets at most its bound. Then a real engine:
a workflow whose every decode asks for a full repair encodes no more than the
baseline engine on the same calls, and more with the bound lifted."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from corps.engine.exec.baseline_work import MARGIN, BaselineWork, Work

SINK, FOOTER = [0], [9]


@dataclass
class Msg:
    tokens: list[int]
    kind: str


class Table:
    """What BaselineWork reads of a message table."""

    def __init__(self) -> None:
        self.msgs: dict[int, Msg] = {}

    def get(self, i: int) -> Msg:
        return self.msgs[i]

    def find(self, i: int) -> Msg | None:
        return self.msgs.get(i)

    @property
    def records(self) -> int:
        return len(self.msgs)


def lcp(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


TOKENS = st.lists(st.integers(1, 4), min_size=1, max_size=6)
OP = st.one_of(
    st.tuples(st.just("prefill"), TOKENS, st.lists(st.integers(0, 50), max_size=4),
              st.integers(0, 40)),
    st.tuples(st.just("decode"), TOKENS, st.lists(st.integers(0, 50), max_size=5),
              st.integers(0, 60), TOKENS),
)  # fmt: skip


class Oracle:
    """The baseline, brute force: what it caches, what each call costs it."""

    def __init__(self) -> None:
        self.cached: list[list[int]] = []
        self.seen: set[int] = set()  # prefills a decode read
        self.unpaid = 0  # prefilled tokens the baseline has not encoded (yet)

    def hit(self, prompt: list[int]) -> int:
        return max((lcp(prompt, s) for s in self.cached), default=0)


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(OP, min_size=1, max_size=25))
def test_repairs_never_cost_more_than_the_baseline_saves(ops):
    table, oracle = Table(), Oracle()
    work = BaselineWork(table, SINK, capacity=10**9)
    choreo = base = 0
    savings: list[tuple[int, int]] = []  # (saving of a decode, repair) in call order
    for op in ops:
        kind, tokens, picks, wanted = op[:4]
        ids = list(table.msgs)
        parents = tuple(dict.fromkeys(ids[p % len(ids)] for p in picks)) if ids else ()
        ctx = SINK + [t for p in parents for t in table.get(p).tokens]
        if kind == "prefill":
            r = min(wanted, work.bound(Work(parents, decode=False)))
            assert r <= len(ctx) - min(oracle.hit(ctx), len(ctx))  # its context's miss
            work.admitted(Work(parents, decode=False), r)
            choreo += len(tokens) + r
            oracle.unpaid += len(tokens)
            savings.append((0, r))
            table.msgs[len(table.msgs)] = Msg(list(tokens), "prefill")
            continue
        header, generated = tokens, op[4]
        call = Work(parents, tuple(header), extra=1 + len(FOOTER))
        prompt = ctx + header
        hit = oracle.hit(prompt)
        miss = len(ctx) - min(hit, len(ctx))
        r = min(wanted, work.bound(call))
        assert r <= (1 - MARGIN) * miss  # never more than the baseline encodes of it
        first, at = 0, len(SINK)
        for p in parents:
            m = table.get(p)
            if m.kind == "prefill" and p not in oracle.seen:
                first += max(0, at + len(m.tokens) - max(at, hit))
            at += len(m.tokens)
        oracle.unpaid -= first
        oracle.seen.update(p for p in parents if table.get(p).kind == "prefill")
        saving = miss - first - max(0, hit - len(ctx)) - 1 - len(FOOTER)
        savings.append((saving, r))
        work.admitted(call, r)
        oracle.cached.append(prompt)
        base += len(prompt) - hit + len(generated) - 1
        choreo += len(header) + len(generated) + len(FOOTER) + r
        reply = header + generated[:-1]
        oracle.cached.append(prompt[: len(ctx)] + reply)
        work.read(parents, reply, None)
        table.msgs[len(table.msgs)] = Msg(header + generated + FOOTER, "decode")
    # repairs spend only savings made before them: past the last repair, choreography
    # may still fall behind by its own overheads, which no repair adds to
    last = max((i for i, (_, r) in enumerate(savings) if r), default=-1)
    after = sum(s for s, _ in savings[last + 1 :])
    assert choreo <= base + oracle.unpaid + max(0, -after)
    if not any(r for _, r in savings):  # no repair: the identity the bound rests on
        assert choreo == base + oracle.unpaid - sum(s for s, _ in savings)


def test_the_bound_is_what_the_baseline_encodes_again():
    """Two decodes read one context in two orders: the first pays its prefills (saving
    nothing beyond its overheads), the second's miss is all of it, read as encoded."""
    table = Table()
    table.msgs = {0: Msg([1, 2, 3, 4], "prefill"), 1: Msg([3, 3, 3, 3, 3, 3], "prefill")}
    work = BaselineWork(table, SINK, capacity=10**9)
    first = Work((0, 1), (5,), extra=2)
    assert work.saving(first) == 1 - 2  # the sink's token, less its extra: a deficit
    assert work.bound(first) == 0  # both prefills first read here: nothing saved
    work.admitted(first, 0)
    second = Work((1, 0), (5,), extra=2)
    assert work.saving(second) == 10 - 2  # all ten context tokens again, less its extra
    assert work.bound(second) == int((1 - MARGIN) * (8 - 1))  # the first's deficit paid
    again = Work((0, 1), (5,), extra=2)  # the first's prompt, cached: header and all
    assert work.saving(again) == -1 - 2


# ---- on an engine ----

QUESTIONS = ("What is seven times six?", "Name a prime above ten.", "Is nine a square?")


async def judged(engine) -> tuple[int, int]:
    """Questions prefilled apart on one system prompt, an answer to each, then three
    judges in turn, each reading the questions and answers in another order and
    asking for a full repair: (tokens encoded, tokens the bound cut)."""
    sys = await engine.prefill("You are a careful solver.", role="system")
    qs = [await engine.prefill(q, parents=[sys], offsets=[0]) for q in QUESTIONS]
    answers = [await engine.decode(parents=[sys, q], max_tokens=6, ignore_eos=True)
               for q in qs]  # fmt: skip
    pairs = list(zip(qs, answers, strict=True))
    cut = 0
    for turn in range(3):
        order = [m for pair in pairs[turn:] + pairs[:turn] for m in pair]
        judge = await engine.decode(parents=[sys, *order], header="Verdict:", max_tokens=4,
                                    ignore_eos=True, repair="full")  # fmt: skip
        cut += judge.tokens_repair_cut
    return engine.stats().tokens_encoded, cut


async def test_full_repairs_encode_no_more_than_the_baseline_on_the_same_calls(tiny_dirs):
    """Each judge's prompt is new to the baseline's prefix cache, so it encodes most of
    it; unbounded, choreography's full repairs recompute that and its prefills come on
    top: it encodes more than the baseline. Bounded, less, and it says what it cut."""
    from conftest import open_tiny

    async with open_tiny(tiny_dirs, "llama", mode="baseline") as engine:
        baseline, _ = await judged(engine)
    async with open_tiny(tiny_dirs, "llama") as engine:
        bounded, cut = await judged(engine)
    async with open_tiny(tiny_dirs, "llama", repair_bound=False) as engine:
        unbounded, none_cut = await judged(engine)
    assert unbounded > baseline  # what the bound exists for
    assert bounded <= baseline and cut > 0 and none_cut == 0
