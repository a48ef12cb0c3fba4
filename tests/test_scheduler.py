"""The batching loop (sched/scheduler.py): concurrency, cancellation, failures, shutdown."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest
from hypothesis import HealthCheck, assume, given, settings, target
from hypothesis import strategies as st

from corps.cache.errors import CacheFullError
from corps.engine.errors import InvalidRequest
from corps.engine.sched.scheduler import EngineBusy, EngineClosed, Scheduler
from corps.engine.trace.reader import Trace

from conftest import open_tiny
from helpers import stepping

PROMPTS = ["hello world", "the quick brown fox", "what is seven", "you are a careful solver"]


def used(engine) -> int:
    return engine.stats().tokens_used


async def test_many_concurrent_callers_share_steps(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine:
        qs = await engine.prefill_many([dict(message=p) for p in PROMPTS])
        results = {}

        async def ask(i: int) -> None:
            results[i] = await engine.decode(parents=[qs[i % 4]], max_tokens=8, ignore_eos=True)

        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(ask, i)
        assert len(results) == 20
        assert all(h.ttft is not None and h.ttft > 0 for h in results.values())
        stats = engine.stats()
        assert stats.mean_batch_size > 2  # calls really shared forward steps
        assert stats.steps < 20 * 9
        assert stats.queue_depth == 0 and stats.tokens_per_s > 0 and stats.mean_ttft_s > 0


async def test_step_time_is_split_into_encoding_and_decoding_steps(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine:
        q = await engine.prefill("hello world")
        after_prefill = engine.stats()
        assert after_prefill.encode_step_s > 0
        assert after_prefill.encode_step_s == after_prefill.step_s  # a prefill only encodes
        await engine.decode(parents=[q], max_tokens=8, ignore_eos=True)
        after = engine.stats()
        # the header's step and the closing footer's encode; the next tokens' only decode
        assert after.encode_step_s > after_prefill.encode_step_s
        assert after.step_s - after.encode_step_s > 0


async def test_greedy_and_seeded_outputs_do_not_depend_on_the_batch(tiny_dirs):
    async with open_tiny(tiny_dirs, "qwen3") as engine:
        qs = await engine.prefill_many([dict(message=p) for p in PROMPTS])
        greedy = dict(parents=[qs[0], qs[1]], max_tokens=12, ignore_eos=True)
        seeded = dict(parents=[qs[2]], max_tokens=12, temperature=1.0, seed=5, ignore_eos=True)
        alone = [await engine.decode(**greedy), await engine.decode(**seeded)]
        crowd = {}

        async def other(i: int) -> None:
            await engine.decode(parents=[qs[i % 4]], max_tokens=6 + i, temperature=0.7, seed=i)

        async def mine(key: str, kw: dict) -> None:
            await stepping(engine)  # join a batch that is already running
            crowd[key] = await engine.decode(**kw)

        before = engine.stats()
        async with anyio.create_task_group() as tg:
            for i in range(15):
                tg.start_soon(other, i)
            tg.start_soon(mine, "greedy", greedy)
            tg.start_soon(mine, "seeded", seeded)
        after = engine.stats()
        calls = after.mean_batch_size * after.steps - before.mean_batch_size * before.steps
        assert calls / (after.steps - before.steps) > 4  # the batch really formed
        assert crowd["greedy"].tokens == alone[0].tokens
        assert crowd["seeded"].tokens == alone[1].tokens


async def test_cancel_mid_decode_rolls_back_and_spares_others(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine:
        q = await engine.prefill("hello world")
        reference = await engine.decode(parents=[q], max_tokens=40, ignore_eos=True)
        engine.free(reference)
        messages = engine.stats().messages
        bystander_running = anyio.Event()
        survivor, at_cancel = {}, {}

        async def victim(scope: anyio.CancelScope) -> None:
            with scope:
                stream = engine.stream(parents=[q], max_tokens=400, ignore_eos=True)
                async with stream:
                    async for _ in stream:
                        if bystander_running.is_set():
                            at_cancel["bystander_done"] = "h" in survivor
                            scope.cancel()  # cancel amid another call that is still running
                            await anyio.lowlevel.checkpoint()

        async def bystander() -> None:
            stream = engine.stream(parents=[q], max_tokens=40, ignore_eos=True)
            async for _ in stream:
                bystander_running.set()
            survivor["h"] = stream.handle

        scope = anyio.CancelScope()
        async with anyio.create_task_group() as tg:
            tg.start_soon(victim, scope)
            tg.start_soon(bystander)
        assert scope.cancel_called and at_cancel == {"bystander_done": False}
        assert survivor["h"].tokens == reference.tokens
        engine.free(survivor["h"])
        await engine.prefill("x")  # one more trip through the loop reaps the cancelled call
        stats = engine.stats()
        assert stats.messages == messages + 1  # the cancelled decode left no message
        live = sum(m.slots for m in engine.messages())
        assert stats.tokens_used == live  # every used slot belongs to a live message


async def test_timeout_cancels_the_call_and_frees_its_slots(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine:
        q = await engine.prefill("hello world")
        messages = engine.stats().messages
        with anyio.move_on_after(0.05) as scope:
            await engine.decode(parents=[q], max_tokens=450, ignore_eos=True)
        assert scope.cancelled_caught
        await engine.prefill("x")  # the loop reaps the cancelled call between steps
        assert engine.stats().messages == messages + 1  # only "x"; the decode left nothing
        live = sum(m.slots for m in engine.messages())
        assert engine.stats().tokens_used == live


async def test_queue_full_nowait_raises_and_await_waits(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama", queue_size=2) as engine:
        q = await engine.prefill("hello world")
        a = engine.decode_nowait(parents=[q], max_tokens=3)
        b = engine.decode_nowait(parents=[q], max_tokens=3)
        with pytest.raises(EngineBusy, match="queue full"):
            engine.decode_nowait(parents=[q], max_tokens=3)
        c = await engine.decode(parents=[q], max_tokens=3)  # waits for room instead
        assert (await a).tokens == (await b).tokens == c.tokens


async def test_one_bad_call_fails_alone(tiny_dirs, monkeypatch):
    import corps.engine.exec.sampler as core_mod

    real_sample, real_rows = core_mod.sample, core_mod.sample_rows

    def flaky(logits, params, generator, index):
        if params.seed == 666:
            raise RuntimeError("injected sampling failure")
        return real_sample(logits, params, generator, index)

    def flaky_rows(logits, params, generators):  # the step's batched draw fails as a whole
        if any(p.seed == 666 for p in params):
            raise RuntimeError("injected sampling failure")
        return real_rows(logits, params, generators)

    monkeypatch.setattr(core_mod, "sample", flaky)
    monkeypatch.setattr(core_mod, "sample_rows", flaky_rows)
    async with open_tiny(tiny_dirs, "llama") as engine:
        q = await engine.prefill("hello world")
        outcomes = {}

        async def run(name: str, **kw) -> None:
            try:
                outcomes[name] = await engine.decode(parents=[q], max_tokens=5, **kw)
            except Exception as exc:
                outcomes[name] = exc

        async with anyio.create_task_group() as tg:
            tg.start_soon(partial_run(run, "ok1"))
            tg.start_soon(partial_run(run, "bad-sample", temperature=1.0, seed=666))
            tg.start_soon(partial_run(run, "bad-input", offsets=[-3]))
            tg.start_soon(partial_run(run, "ok2", temperature=1.0, seed=1))
        assert isinstance(outcomes["bad-sample"], RuntimeError)
        assert isinstance(outcomes["bad-input"], InvalidRequest)
        assert not isinstance(outcomes["ok1"], Exception)
        assert not isinstance(outcomes["ok2"], Exception)
        live = sum(m.slots for m in engine.messages())
        assert engine.stats().tokens_used == live


def partial_run(fn, name, **kw):
    async def go() -> None:
        await fn(name, **kw)

    return go


async def test_shutdown_with_work_in_flight_fails_waiters_and_never_hangs(tiny_dirs):
    errors = []
    with anyio.fail_after(60):
        async with open_tiny(tiny_dirs, "llama") as engine:
            q = await engine.prefill("hello world")

            async def waiter() -> None:
                try:
                    await engine.decode(parents=[q], max_tokens=400, ignore_eos=True)
                except EngineClosed as exc:
                    errors.append(exc)

            async with anyio.create_task_group() as outer:
                for _ in range(3):
                    outer.start_soon(waiter)
                await stepping(engine)  # the waiters' calls are running
                await engine._sched.close()
    assert len(errors) == 3
    with pytest.raises(EngineClosed, match="shut down"):
        await engine.prefill("after")


async def test_loop_crash_fails_every_waiter_with_the_cause(tiny_dirs, monkeypatch):
    def boom(self, new, t0):
        raise MemoryError("injected loop failure")

    monkeypatch.setattr(Scheduler, "_step_sync", boom)
    got = []
    with anyio.fail_after(30):
        async with open_tiny(tiny_dirs, "llama") as engine:

            async def call() -> None:
                try:
                    await engine.prefill("hello")
                except EngineClosed as exc:
                    got.append(exc)

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                tg.start_soon(call)
            with pytest.raises(EngineClosed, match="crashed"):
                await engine.prefill("later")
    assert len(got) == 2
    assert all("crashed" in str(e) and isinstance(e.__cause__, MemoryError) for e in got)


async def test_engine_must_be_started(tiny_dirs):
    engine = open_tiny(tiny_dirs, "llama")
    with pytest.raises(EngineClosed, match="not started"):
        await engine.prefill("hello")


@pytest.mark.real_model
@pytest.mark.parametrize(("dtype", "tie"), [("float32", 0.02), ("mixed", 0.25)])
async def test_real_model_batch_changes_greedy_tokens_only_on_near_ties(
    real_dir, real_hf, dtype, tie
):
    """What the README promises: a batch may change a greedy token only where the
    model's top two logits are within rounding of each other (float32 rounding, or
    16-bit rounding under mixed, whose kernels follow the step's row count)."""
    import torch

    from corps.engine.api.engine import Engine

    prompts = [
        "List three prime numbers.",
        "Name a colour and a fruit.",
        "What is the capital of France?",
        "Write one sentence about the sea.",
        "Is 91 prime? Answer briefly.",
        "Give a synonym for happy.",
        "Count from one to five.",
        "What do bees make?",
    ]
    kw = dict(max_tokens=32, temperature=0.0)
    # dense weights: the margins are transformers' over the same (de-quantized) weights
    async with Engine.load(str(real_dir), capacity=8192, dtype=dtype, weights="dense") as engine:
        qs = [await engine.prefill(p) for p in prompts]
        alone = [await engine.decode(parents=[q], **kw) for q in qs]
        before = engine.stats()
        together = await engine.decode_many([dict(parents=[q], **kw) for q in qs])
        after = engine.stats()
        fmt = engine.chat
        sink, header = fmt.sink, fmt.encode(fmt.frame("assistant")[0])
    calls = after.mean_batch_size * after.steps - before.mean_batch_size * before.steps
    assert calls / (after.steps - before.steps) > 4  # the batch really formed
    margins = []  # per call: HF's top-2 logit gap before each generated token
    for q, a in zip(qs, alone, strict=True):
        prompt = sink + q.tokens + header
        with torch.no_grad():
            logits = real_hf(torch.tensor([prompt + a.generated])).logits[0]  # (T, V)
        top2 = logits[len(prompt) - 1 : len(prompt) - 1 + len(a.generated)].topk(2).values
        margins.append((top2[:, 0] - top2[:, 1]).tolist())
    assert min(min(m) for m in margins) < 0.05  # the inputs do contain near-ties
    for a, t, gaps in zip(alone, together, margins, strict=True):
        if a.generated != t.generated:  # greedy: they differ at some token, maybe the stop
            pairs = zip(a.generated, t.generated, strict=False)
            i = next(k for k, (x, y) in enumerate(pairs) if x != y)
            assert gaps[i] < tie, f"a batch changed token {i} though its margin is {gaps[i]}"


async def test_baseline_encodes_a_prompt_shared_by_concurrent_calls_once(tiny_dirs):
    """Four voters over one long prompt, submitted together: the prompt is encoded once,
    and each voter's tokens are what it generates alone."""
    async with open_tiny(tiny_dirs, "llama", mode="baseline") as engine:
        sys = await engine.prefill("you are a careful judge " * 40, role="system")
        q = await engine.prefill("which answer is best", parents=[sys])
        prompt = sys.length + q.length
        assert prompt > 200
        kw = [dict(parents=[sys, q], max_tokens=6, ignore_eos=True, seed=i) for i in range(4)]
        before = engine.stats()
        voters = await engine.decode_many(kw)
        after = engine.stats()
        own = sum(v.length for v in voters)  # header + generated + footer of each
        assert after.tokens_encoded - before.tokens_encoded <= prompt + own + 4
        shared = after.prefix_shared_in_batch - before.prefix_shared_in_batch
        assert shared >= 3 * prompt  # the three followers read the leader's encoding
        alone = [await engine.decode(**k) for k in kw]
        assert [v.tokens for v in voters] == [a.tokens for a in alone]


# ---- preemption: a full store evicts what no call reads instead of failing ----


async def _crowd(engine):
    """Two ~50-token messages, then a long decode that does not fit beside both, then a
    call over the first message (whose encoding the decode's admission dropped)."""
    a = await engine.prefill("alpha beta gamma delta " * 2)
    b = await engine.prefill("one two three four five " * 2)
    long = await engine.decode(parents=[b], max_tokens=90, ignore_eos=True)
    back = await engine.decode(parents=[a], max_tokens=8, ignore_eos=True)
    return long.text, back.text, a.length


async def test_a_full_store_evicts_and_recomputes_instead_of_failing(tiny_dirs, tmp_path):
    async with open_tiny(tiny_dirs, "llama", capacity=4096) as roomy:
        want = await _crowd(roomy)
    async with open_tiny(tiny_dirs, "llama", capacity=180, evict=False) as strict:
        with pytest.raises(CacheFullError):
            await _crowd(strict)
    path = tmp_path / "tight.jsonl"
    async with open_tiny(tiny_dirs, "llama", capacity=180, trace=path) as tight:
        got = await _crowd(tight)
        assert got == want  # the same tokens: the same encodings
        stats = tight.stats()
        assert stats.messages_evicted >= 1 and stats.tokens_recomputed >= got[2]
        tight.check()
    # the trace's step events say which steps evicted and recomputed, and how much
    steps = Trace.load(path).steps
    assert sum(s.evicted for s in steps) == stats.tokens_evicted > 0
    assert sum(s.recomputed for s in steps) == stats.tokens_recomputed > 0
    assert sum(1 for s in steps if s.evicted) < len(steps)  # only where it happened


WORDS = ["red", "sky", "two", "cat", "run", "blue", "sun", "four"]


@st.composite
def _workloads(draw):
    """Prefills of a few words, decodes over up to two earlier messages, frees."""
    ops, live = [], 0
    for _ in range(draw(st.integers(6, 20))):
        kind = draw(
            st.sampled_from(["prefill", "decode", "decode", "free"] if live else ["prefill"])
        )
        if kind == "prefill":
            ops.append(("prefill", " ".join(draw(st.lists(st.sampled_from(WORDS), max_size=3)))))
            live += 1
        elif kind == "decode":
            parents = draw(st.lists(st.integers(0, live - 1), max_size=2, unique=True))
            ops.append(("decode", parents, draw(st.integers(1, 8))))
            live += 1
        else:
            ops.append(("free", draw(st.integers(0, live - 1))))
    return ops


async def _play(engine, ops, sizes: list[int] | None = None) -> tuple[list[str], list[int]]:
    """Run ops one at a time (every step alone: recomputes are exact); the decodes'
    texts, and each message's tokens.

    `sizes`: each message's tokens as the roomy run made them. A decode that fails
    for room is then rejected (the example, not the engine) if its working set, all
    messages its parents were encoded over transitively and its own tokens, cannot
    fit in the store at once: no eviction order could have run it."""
    made, texts, over, lens = [], [], [], []  # over: each message's parents (in made)
    await engine.prefill("filler " * 4)  # never read again: the first to yield
    for op in ops:
        if op[0] == "prefill":
            made.append(await engine.prefill(op[1] or "."))
            over.append([])
            lens.append(len(made[-1].tokens))
        elif op[0] == "decode":
            parents = [made[i] for i in op[1] if made[i] is not None]
            try:
                h = await engine.decode(parents=parents, max_tokens=op[2], ignore_eos=True)
            except CacheFullError:
                if sizes is not None:
                    need = _closure([i for i in op[1] if made[i] is not None], over)
                    own = sizes[len(made)]
                    # fits (the store's sink slot too): the engine should have run it
                    assume(1 + sum(sizes[i] for i in need) + own <= engine.stats().capacity)
                raise
            made.append(h)
            over.append([i for i in op[1] if made[i] is not None])
            lens.append(len(h.tokens))
            texts.append(h.text)
        elif made[op[1]] is not None:
            engine.free(made[op[1]])
            made[op[1]] = None
    return texts, lens


def _closure(start: list[int], over: list[list[int]]) -> set[int]:
    seen, todo = set(), list(start)
    while todo:
        i = todo.pop()
        if i not in seen:
            seen.add(i)
            todo.extend(over[i])
    return seen


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=_workloads())
def test_any_workload_on_a_tight_store_decodes_what_a_roomy_one_does(tiny_dirs, ops):
    """The oracle is the same workload on a store that never fills: eviction and
    recompute change nothing a caller sees, and the bookkeeping stays exact."""

    async def both():
        async with open_tiny(tiny_dirs, "llama-sink", capacity=4096) as roomy:
            want, sizes = await _play(roomy, ops)
        async with open_tiny(tiny_dirs, "llama-sink", capacity=72) as tight:
            got, _ = await _play(tight, ops, sizes)
            tight.check()
            target(float(tight.stats().tokens_recomputed))  # search toward recomputes
        return want, got

    want, got = anyio.run(both)
    assert got == want


async def test_calls_a_policy_leaves_out_of_a_step_wait_and_decode_what_they_would(tiny_dirs):
    """`objective` with a learnt cost that lets one throughput call beside a critical
    one: the others sit steps out (at most three in a row), keep their place, and
    decode what they do alone."""
    from corps.engine.sched.cost import StepCost

    async with open_tiny(tiny_dirs, "qwen3", policy="objective") as engine:
        qs = await engine.prefill_many([dict(message=p) for p in PROMPTS])
        kws = [dict(parents=[q], max_tokens=10, ignore_eos=True) for q in qs]
        alone = [await engine.decode(**kw) for kw in kws]
        cost = StepCost()
        for calls in (1, 2, 3):  # each call doubles a step: only one fits beside a chat
            cost.observe(calls, calls, 0.01 * calls)
        engine.policy.cost = cost
        engine.policy.step_slowdown = 2.0  # the chat's step and one more call's
        engine.policy.starve_steps = 3
        engine.policy.observe = lambda *step: None  # the cost stays as set
        engine.policy.feedback = None  # the bound's whole headroom, whatever steps take
        chosen = []
        step_calls = engine.policy.step_calls
        engine.policy.step_calls = lambda order: chosen.append(step_calls(order)) or (chosen[-1])
        got = {}

        async def bulk(i: int) -> None:
            got[i] = await engine.decode(**kws[i])

        async def chat() -> None:
            await stepping(engine)  # the bulk calls are running
            with engine.workflow("chat", objective="latency"):
                got["chat"] = await engine.decode(**{**kws[0], "max_tokens": 20})

        async with anyio.create_task_group() as tg:
            for i in range(len(kws)):
                tg.start_soon(bulk, i)
            tg.start_soon(chat)
        assert [got[i].tokens for i in range(len(kws))] == [a.tokens for a in alone]
        assert got["chat"].generated[:10] == alone[0].generated
        assert any(len(c) == 2 for c in chosen)  # the chat and one bulk call, others waited
        assert any(len(c) > 2 for c in chosen)  # ... until they had waited three steps
        engine.check()


async def test_the_policy_hears_each_steps_wall_time_as_the_trace_records_it(tiny_dirs, tmp_path):
    """The loop tells the policy what each step took as its calls waited for it
    (admission, forward, hop back): the `dur` of each step in the trace."""
    from corps.engine.trace.reader import Trace

    trace = tmp_path / "t.jsonl"
    async with open_tiny(tiny_dirs, "qwen3", policy="objective", trace=trace) as engine:
        walls: list[float] = []
        stepped = engine.policy.stepped
        engine.policy.stepped = lambda wall: walls.append(wall) or stepped(wall)
        with engine.workflow("chat", objective="latency"):
            q = await engine.prefill(PROMPTS[0])
            await engine.decode(parents=[q], max_tokens=6, ignore_eos=True)
    steps = Trace.load(trace).steps
    assert len(walls) == len(steps) >= 6
    assert walls == [s.dur for s in steps]


@pytest.mark.parametrize("linger", [True, False])
async def test_a_critical_calls_successor_joins_the_next_step(tiny_dirs, tmp_path, linger):
    """In a latency workflow a prompt's reply, asked as soon as the prompt is encoded,
    is queued before the loop starts its next step (the loop waits a few event-loop
    turns after a step that ended a critical call), though other calls keep it busy.
    Without that wait (linger=False: the check fails) the next step starts first."""
    import json

    from corps.engine.sched import scheduler as sched

    trace = tmp_path / "t.jsonl"
    async with open_tiny(tiny_dirs, "qwen3", policy="objective", trace=trace) as engine:
        if not linger:
            turns, sched.GATHER_TURNS = sched.GATHER_TURNS, 0
        try:
            q = await engine.prefill(PROMPTS[1])
            got = {}

            async def bulk() -> None:
                got["bulk"] = await engine.decode(parents=[q], max_tokens=40, ignore_eos=True)

            async def chat() -> None:
                await stepping(engine)  # the bulk call is running
                with engine.workflow("chat", objective="latency"):
                    p = await engine.prefill(PROMPTS[2])
                    got["reply"] = await engine.decode(parents=[p], max_tokens=4)

            async with anyio.create_task_group() as tg:
                tg.start_soon(bulk)
                tg.start_soon(chat)
        finally:
            if not linger:
                sched.GATHER_TURNS = turns
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    reply = got["reply"].id
    made = {e["message"]: e["call"] for e in events if e["type"] == "end" and e.get("message")}
    call = made[reply]
    prompt = next(e["call"] for e in events if e["type"] == "queued" and e["call"] < call
                  and e["kind"] == "prefill" and e.get("critical"))  # fmt: skip
    ended = next(e["t"] for e in events if e["type"] == "end" and e["call"] == prompt)
    queued = next(e["t"] for e in events if e["type"] == "queued" and e["call"] == call)
    next_step = min(e["t"] for e in events if e["type"] == "step" and e["t"] > ended)
    assert got["bulk"].generated and (queued < next_step) == linger


async def test_step_events_say_what_each_step_ran(tiny_dirs, tmp_path):
    """Step events carry the rows and calls the step ran and its time before the forward."""
    from corps.engine.trace.reader import Trace

    trace = tmp_path / "t.jsonl"
    async with open_tiny(tiny_dirs, "llama", trace=trace) as engine:
        q = await engine.prefill(PROMPTS[3])
        kws = [dict(parents=[q], max_tokens=5, ignore_eos=True, seed=i) for i in range(3)]
        await engine.decode_many(kws)
        encoded = engine.stats().tokens_encoded
    steps = Trace.load(trace).steps
    assert steps and all(s.rows >= s.stepped >= 1 for s in steps)
    assert all(0 <= s.admit_s <= s.dur for s in steps)
    assert max(s.stepped for s in steps) == 3  # the three decodes in one step
    assert sum(s.rows for s in steps) >= encoded  # twins' rows are copied, not encoded


async def test_a_call_with_room_is_queued_before_its_caller_yields():
    """`submit` puts a call in the queue with no yield first when there is room, so the
    loop cannot plan a step without a call that was already made; a full queue waits."""
    from corps.engine.exec.call import Call

    sched = Scheduler(executor=None, queue_size=1)  # type: ignore[arg-type]  # no loop runs
    sched.started = True
    seen = []

    async def other() -> None:  # runs at the submitter's first yield
        seen.append(sched.queue_depth())

    async with anyio.create_task_group() as tg:
        tg.start_soon(other)
        await sched.submit(Call.queued(None))
        await anyio.lowlevel.checkpoint()
        assert seen == [1]
        with anyio.move_on_after(0.05) as scope:  # full: it waits for room
            await sched.submit(Call.queued(None))
        assert scope.cancelled_caught and sched.queue_depth() == 1


# ---- steps run ahead of the loop (run_ahead) ----


def chain_lengths(monkeypatch) -> list[int]:
    """Record how many steps each hop to the torch thread ran."""
    lengths: list[int] = []
    steps_sync = Scheduler._steps_sync

    def counted(self, new, t0):
        ran = steps_sync(self, new, t0)
        lengths.append(len(ran))
        return ran

    monkeypatch.setattr(Scheduler, "_steps_sync", counted)
    return lengths


def on_step(monkeypatch, at: int, act) -> None:
    """Run `act()` on the event loop after the torch thread's step number `at` (0-based)
    and wait there until it has run, as a call made while that step ran would be."""
    import asyncio
    import threading

    loop = asyncio.get_running_loop()
    step_sync = Scheduler._step_sync
    count = iter(range(1 << 30))

    def step(self, new, t0):
        out = step_sync(self, new, t0)
        if next(count) == at:
            done = threading.Event()
            loop.call_soon_threadsafe(lambda: (act(), done.set()))
            done.wait()
        return out

    monkeypatch.setattr(Scheduler, "_step_sync", step)


async def decode_mix(engine, prompts=PROMPTS) -> list:
    """Greedy and seeded calls of different lengths (they end in different steps)."""
    qs = await engine.prefill_many([dict(message=p) for p in prompts])
    kws = [
        dict(parents=[qs[i % 4]], max_tokens=3 + 2 * i, ignore_eos=True, seed=i)
        | (dict(temperature=0.8) if i % 2 else {})
        for i in range(8)
    ]
    return await engine.decode_many(kws)


@pytest.mark.parametrize("mode", ["choreographed", "baseline"])
async def test_running_ahead_decodes_and_steps_what_a_hop_per_step_does(
    tiny_dirs, tmp_path, monkeypatch, mode
):
    """The same tokens, in the same steps of the same rows, with run_ahead=1 (a hop to
    the loop after every step) and the default: only the hops differ (float32)."""
    runs = {}
    for ahead in (1, 8):
        lengths = chain_lengths(monkeypatch)
        trace = tmp_path / f"{mode}-{ahead}.jsonl"
        async with open_tiny(tiny_dirs, "qwen3", mode=mode, run_ahead=ahead, trace=trace) as e:
            handles = await decode_mix(e)
            runs[ahead] = [h.tokens for h in handles], e.stats().steps
        steps = [(s.rows, s.stepped, s.sampled) for s in Trace.load(trace).steps]
        runs[ahead] += (steps, max(lengths))
        monkeypatch.undo()
    (tokens1, steps1, shape1, most1), (tokens8, steps8, shape8, most8) = runs[1], runs[8]
    assert tokens8 == tokens1 and steps8 == steps1 and shape8 == shape1
    assert most1 == 1 and 1 < most8 <= 8  # it ran ahead, at most run_ahead steps a hop


async def test_a_call_made_while_steps_run_ahead_joins_the_next_step(
    tiny_dirs, tmp_path, monkeypatch
):
    lengths = chain_lengths(monkeypatch)
    trace = tmp_path / "t.jsonl"
    async with open_tiny(tiny_dirs, "llama", trace=trace) as engine:
        q = await engine.prefill(PROMPTS[0])
        late = []

        def call() -> None:
            late.append(engine.decode_nowait(parents=[q], max_tokens=2))

        on_step(monkeypatch, 3, call)  # counted from here: step 3 is the decode's fourth
        lengths.clear()
        first = await engine.decode(parents=[q], max_tokens=20, ignore_eos=True)
        second = await late[0]
    assert len(second.generated) == 2 and len(first.generated) == 20
    assert lengths[0] == 4  # the first hop ended at the step while which the call came
    decode_steps = Trace.load(trace).steps[-sum(lengths) :]
    assert [s.stepped for s in decode_steps[3:6]] == [1, 2, 2]  # it joined the next step


async def test_a_call_cancelled_while_steps_run_ahead_stops_them_and_leaves_nothing(
    tiny_dirs, monkeypatch
):
    lengths = chain_lengths(monkeypatch)
    async with open_tiny(tiny_dirs, "llama") as engine:
        q = await engine.prefill(PROMPTS[1])
        before = used(engine)
        pending = engine.decode_nowait(parents=[q], max_tokens=30, ignore_eos=True)
        other = engine.decode_nowait(parents=[q], max_tokens=12, ignore_eos=True)
        on_step(monkeypatch, 4, pending.cancel)  # counted from here: the fifth step
        lengths.clear()
        kept = await other
        with pytest.raises(Exception) as info:
            await pending
        assert type(info.value).__name__ == "CallCancelled"
        assert len(kept.generated) == 12
        engine.free(kept)
        assert used(engine) == before  # the cancelled call's tokens rolled back
    assert lengths[0] == 5  # the hop that ran step 4 ended there


async def test_a_streamed_call_gets_each_token_between_steps(tiny_dirs, monkeypatch):
    """A call whose tokens stream (`on_token`) takes every token as its step ends:
    no step runs ahead while it runs."""
    lengths = chain_lengths(monkeypatch)
    async with open_tiny(tiny_dirs, "llama") as engine:
        q = await engine.prefill(PROMPTS[2])
        lengths.clear()
        async with engine.stream(parents=[q], max_tokens=10, ignore_eos=True) as s:
            deltas = [d async for d in s]
    assert deltas and set(lengths) == {1}


async def test_the_policy_hears_each_step_before_the_next_is_planned(tiny_dirs):
    """Run ahead or not, a step is planned after the policy heard every step before it."""
    async with open_tiny(tiny_dirs, "qwen3", policy="objective") as engine:
        policy, heard, planned = engine.policy, [], []
        stepped, step_order = policy.stepped, policy.step_order
        policy.stepped = lambda wall: heard.append(wall) or stepped(wall)
        policy.step_order = lambda running: planned.append(len(heard)) or step_order(running)
        with engine.workflow("chat", objective="latency"):
            q = await engine.prefill(PROMPTS[0])
            await engine.decode(parents=[q], max_tokens=12, ignore_eos=True)
    assert planned == list(range(len(planned))) and len(heard) == len(planned) >= 12


async def test_another_engines_step_takes_its_turn_between_steps_run_ahead(tiny_dirs, monkeypatch):
    """Work queued for the torch thread (another engine's step) ends a run ahead: the
    engines sharing the thread still take turns a step at a time when both are busy."""
    from corps.engine.exec.torch_thread import TORCH

    lengths = chain_lengths(monkeypatch)
    async with open_tiny(tiny_dirs, "llama") as engine:
        q = await engine.prefill(PROMPTS[0])
        other = []
        on_step(monkeypatch, 2, lambda: other.append(TORCH.submit(lambda: "its turn")))
        lengths.clear()
        await engine.decode(parents=[q], max_tokens=12, ignore_eos=True)
    assert lengths[0] == 3 and other[0].result() == "its turn"


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    lengths=st.lists(st.integers(1, 24), min_size=2, max_size=8),
    cancel_after=st.lists(st.integers(0, 20), max_size=4),
    run_ahead=st.sampled_from([2, 8]),
)
def test_calls_cancelled_at_any_step_of_a_run_ahead_leave_the_store_exact(
    tiny_dirs, lengths, cancel_after, run_ahead
):
    """Decodes of mixed lengths, some cancelled after a number of steps (pending calls
    cancelled from the loop while steps run ahead on the torch thread): the others
    finish, and the store's bookkeeping is exact with only their messages left."""

    async def main() -> None:
        async with open_tiny(tiny_dirs, "llama", run_ahead=run_ahead) as engine:
            q = await engine.prefill(PROMPTS[0])
            before = used(engine)
            calls = [
                engine.decode_nowait(parents=[q], max_tokens=n, ignore_eos=True) for n in lengths
            ]
            victims = {i % len(calls): steps for i, steps in enumerate(cancel_after)}

            async def cancel(i: int, steps: int) -> None:
                await stepping(engine, steps) if steps else None
                calls[i].cancel()

            done = {}

            async def collect() -> None:
                for i, pending in enumerate(calls):
                    try:
                        done[i] = await pending
                    except Exception as exc:
                        assert i in victims and type(exc).__name__ == "CallCancelled"
                # every call ended: a victim whose step never came (all ended before
                # it) stops waiting for it
                tg.cancel_scope.cancel()

            async with anyio.create_task_group() as tg:
                for i, steps in victims.items():
                    tg.start_soon(cancel, i, steps)
                tg.start_soon(collect)
            assert set(done) >= set(range(len(calls))) - set(victims)
            assert all(len(h.generated) == lengths[i] for i, h in done.items())
            engine.check()
            for h in done.values():
                engine.free(h)
            engine.free(await engine.prefill("x"))  # a trip through the loop reaps the rest
            engine.check()
            assert used(engine) == before  # only the prompt's encoding is left

    anyio.run(main)


@pytest.mark.parametrize("mode", ["choreographed", "baseline"])
async def test_a_running_call_pins_each_parent_once(tiny_dirs, mode):
    """A call's parents are pinned once while it runs: by its job at submission, that pin
    handed to the call at admission (`Call.pins`), not pinned a second time; and no pin
    is left once it ends."""
    async with open_tiny(tiny_dirs, "llama", mode=mode) as engine:
        a = await engine.prefill("the quick brown fox")
        b = await engine.prefill("jumps over the lazy dog")
        table, seen = engine.executor.table, []
        stream = engine.stream(parents=[a, b], max_tokens=4, ignore_eos=True)
        async for _ in stream:
            seen.append((table.get(a.id).pins, table.get(b.id).pins))
        # while it runs, once each (its last deltas may come after it ended: none then)
        assert seen[0] == (1, 1) and all(pins in ((1, 1), (0, 0)) for pins in seen)
        assert (table.get(a.id).pins, table.get(b.id).pins) == (0, 0)
        engine.free(stream.handle)
        engine.check()
