"""engine/exec/repairs.py: a call's repair recomputes rewired context tokens in its
own context, as transformers computes them there, and touches nothing else."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corps.agents import Agent, Runtime
from corps.cache.visibility import Private
from corps.engine.errors import InvalidRequest
from corps.engine.exec.call import Call
from corps.engine.model.runner import layer_qkv
from corps.engine.repair import QUERY_ROWS
from corps.engine.request.requests import DecodeRequest, PrefillRequest
from corps.engine.request.sampling_params import SamplingParams

import conftest
from conftest import same_encoding
from helpers import order, run_calls

TOL = 1e-4
TEXTS = ("You are a careful solver.", "What is seven times six?", "Name a prime above ten.")


def open_tiny(tiny_dirs, name: str = "llama", **kwargs):
    """A tiny engine whose repairs are not capped by the baseline's work: these tests
    measure what a policy recomputes (the bound: tests/test_baseline_work.py)."""
    return conftest.open_tiny(tiny_dirs, name, **{"repair_bound": False, **kwargs})


def prefill(core, message, **kw):
    (h,), _ = run_calls(core, [PrefillRequest(message, **kw)])
    return h


def parallel(core):
    """A system prompt and two questions encoded apart on it (at the same offset)."""
    sys = prefill(core, TEXTS[0], role="system")
    q1 = prefill(core, TEXTS[1], parents=[sys])
    q2 = prefill(core, TEXTS[2], parents=[sys], offsets=[0])
    return sys, q1, q2


def greedy(n, **kw):
    return SamplingParams(max_tokens=n, ignore_eos=True, **kw)


def hf_greedy(hf, ids, n):
    hf.generation_config.eos_token_id = None
    ids_t = torch.tensor([ids], device=hf.device)
    out = hf.generate(ids_t, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[0, len(ids) :].tolist()


def header_of(h, n, core):
    footer = core.fmt.encode(core.fmt.frame("assistant")[1])
    return h.tokens[: len(h.tokens) - n - len(footer)]


def test_full_repair_reads_what_encoding_the_context_in_order_gives(tiny_dirs, tiny_hf, backend):
    """Both questions read together: choreographed, q2 never saw q1; repaired in full,
    the call reads what transformers computes for the whole conversation."""
    core = open_tiny(tiny_dirs, "llama").executor
    hf = tiny_hf["llama"]
    sys, q1, q2 = parallel(core)
    seq = core.fmt.sink + sys.tokens + q1.tokens + q2.tokens
    got = {}
    for repair in ("none", "full"):
        (h,) = run_calls(core, [DecodeRequest(parents=[sys, q1, q2], sampling=greedy(12),
                                              repair=repair)])[0]  # fmt: skip
        got[repair] = h
    full = got["full"]
    assert full.generated == hf_greedy(hf, seq + header_of(full, 12, core), 12)
    assert got["none"].generated != full.generated  # the tiny model does read q1 in q2
    stats = core.stats()  # q2 is the rewired parent: all of it, once (the "full" call)
    assert (stats.tokens_repaired, stats.tokens_probed) == (q2.length, 0)


def test_serial_lays_overlapping_parents_end_to_end(tiny_dirs, tiny_hf):
    """Questions read at one offset (multi-QA's parallel layout): no recompute gives the
    ordered conversation's tokens, "serial" moves them end to end (as reading them with
    default offsets does), and "serial+full" reads what transformers computes."""
    core = open_tiny(tiny_dirs, "llama").executor
    sys, q1, q2 = parallel(core)
    at = q1.offset
    overlap = dict(offsets=[None, at, at], new_offset=at + max(q1.length, q2.length))
    seq = core.fmt.sink + sys.tokens + q1.tokens + q2.tokens
    got = {}
    for label, kw in [
        ("full", dict(overlap, repair="full")),
        ("serial", dict(overlap, repair="serial")),
        ("default offsets", {}),
        ("serial+full", dict(overlap, repair="serial+full")),
    ]:
        (h,) = run_calls(core, [DecodeRequest(parents=[sys, q1, q2], sampling=greedy(12), **kw)])[0]
        got[label] = h
    full = got["serial+full"]
    assert full.generated == hf_greedy(tiny_hf["llama"], seq + header_of(full, 12, core), 12)
    assert got["serial"].generated == got["default offsets"].generated
    assert got["full"].generated != full.generated  # overlapping positions stay wrong
    assert got["serial"].offset == at + q1.length + q2.length == got["serial+full"].offset
    assert got["full"].offset == at + max(q1.length, q2.length)


def test_on_a_chain_nothing_is_repaired(tiny_dirs):
    core = open_tiny(tiny_dirs, "llama").executor
    sys = prefill(core, TEXTS[0], role="system")
    q1 = prefill(core, TEXTS[1], parents=[sys])
    got = []
    for repair in ("none", "full", "recompute:0.5"):
        (h,) = run_calls(core, [DecodeRequest(parents=[sys, q1], sampling=greedy(8),
                                              repair=repair)])[0]  # fmt: skip
        got.append(h.generated)
    assert got[0] == got[1] == got[2]
    assert (core.stats().tokens_repaired, core.stats().tokens_probed) == (0, 0)


def test_empty_policies_are_none_and_first_k_past_every_parent_is_full(tiny_dirs):
    core = open_tiny(tiny_dirs, "llama").executor
    sys, q1, q2 = parallel(core)
    run = {}
    for repair in ("none", "recompute:0", "first:0", "full", "first:1000"):
        (h,) = run_calls(core, [DecodeRequest(parents=[sys, q2, q1], sampling=greedy(10),
                                              repair=repair)])[0]  # fmt: skip
        run[repair] = h.generated
    assert run["none"] == run["recompute:0"] == run["first:0"]
    assert run["full"] == run["first:1000"]


def repaired_view(core, request):
    """Admit `request`, run its repair rows only, and return the call (view intact)."""
    call = core.admit(Call(request=request))
    while call.repair is not None and call.repair.left:
        out = core.step(order([call]))
        assert not out.failed
    return call


def hf_kv(hf, view_k, view_v, j: int, token: int, position: int):
    """Transformers' keys and values (L, Hkv, D) of `token` at `position` after the
    view's first j keys and values (every layer): what a recomputed token must hold."""
    from transformers import DynamicCache

    cache = DynamicCache()
    if j:
        for layer in range(view_k.shape[0]):
            cache.update(view_k[layer][None, :, :j], view_v[layer][None, :, :j], layer)
    with torch.no_grad():
        out = hf(
            input_ids=torch.tensor([[token]], device=hf.device),
            position_ids=torch.tensor([[position]], device=hf.device),
            cache_position=torch.tensor([j], device=hf.device),
            past_key_values=cache,
            use_cache=True,
        )
    keys = torch.stack([layer.keys[0, :, j] for layer in out.past_key_values.layers])
    values = torch.stack([layer.values[0, :, j] for layer in out.past_key_values.layers])
    return keys, values


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    policy=st.sampled_from(
        ["first:1", "first:3", "recompute:0.3", "first:2+recompute:0.2", "full"]
    ),
    order=st.permutations([0, 1, 2]),
    gap=st.integers(0, 6),
)
def test_a_recomputed_tokens_encoding_is_transformers_in_the_calls_context(
    tiny_dirs, tiny_hf, policy, order, gap
):
    """Whatever the policy and layout, each recomputed token holds what transformers
    computes for it over the view before it (reused keys, and recomputed ones where
    earlier tokens were recomputed); every other token keeps its reused encoding."""
    core = open_tiny(tiny_dirs, "llama").executor
    hf = tiny_hf["llama"]
    msgs = parallel(core)
    parents = [msgs[i] for i in order]
    offsets, at = [], len(core.fmt.sink)
    for i, p in enumerate(parents):
        at += gap if i == 1 else 0
        offsets.append(at)
        at += p.length
    request = DecodeRequest(parents=parents, offsets=offsets, sampling=greedy(2), repair=policy)
    plain = core.admit(
        Call(request=DecodeRequest(parents=parents, offsets=offsets, sampling=greedy(2)))
    )
    call = repaired_view(core, request)
    try:
        rows = call.repair
        assert rows is not None and rows.at == sorted(rows.at)
        k, v = call.view.k, call.view.v  # (L, Hkv, n, D) rotated keys, values
        n = call.view.ctx_len  # the context (its prompt may have run in the same step)
        for j, tok, pos in zip(rows.at, rows.ids, rows.positions, strict=True):
            want_k, want_v = hf_kv(hf, k, v, j, tok, pos)
            assert (k[:, :, j] - want_k).abs().max().item() <= TOL
            assert (v[:, :, j] - want_v).abs().max().item() <= TOL
        kept = [j for j in range(n) if j not in set(rows.at)]
        assert torch.equal(k[:, :, kept], plain.view.k[:, :, kept])  # reused as they were
        assert torch.equal(v[:, :, kept], plain.view.v[:, :, kept])
    finally:
        core.abort(call)
        core.abort(plain)
    core.check()


async def test_a_repair_changes_nothing_another_reader_reads(tiny_dirs):
    """Two concurrent readers of the same parents, one repaired: the other decodes what
    it decodes alone, and the store and every message are as before."""
    async with open_tiny(tiny_dirs, "llama") as engine:
        sys = await engine.prefill(TEXTS[0], role="system")
        q1 = await engine.prefill(TEXTS[1], parents=[sys])
        q2 = await engine.prefill(TEXTS[2], parents=[sys], offsets=[0])
        kw = dict(parents=[sys, q1, q2], max_tokens=10, ignore_eos=True)
        alone = await engine.decode(**kw)
        repaired, other = await engine.decode_many([dict(repair="full", **kw), kw])
        assert other.generated == alone.generated
        assert repaired.tokens_repaired == q2.length and other.tokens_repaired == 0
        again = await engine.decode(**kw)  # q2's stored encoding is still its own
        assert again.generated == alone.generated
        engine.check()


async def test_a_repair_set_on_the_workflow_or_the_agent_applies_unless_the_call_names_one(
    tiny_dirs,
):
    """Precedence: the call's `repair=`, else its agent's, else its workflow's, else
    the engine's (none here)."""

    class Full(Agent):
        repair = "full"

        async def handle(self, msg):  # msg: a nudge; it reads the questions
            return await self.decode(**kw)

    async with open_tiny(tiny_dirs, "llama") as engine, Runtime(engine) as rt:
        sys = await engine.prefill(TEXTS[0], role="system")
        q1 = await engine.prefill(TEXTS[1], parents=[sys])
        q2 = await engine.prefill(TEXTS[2], parents=[sys], offsets=[0])
        kw = dict(parents=[sys, q1, q2], max_tokens=2, ignore_eos=True)
        assert (await engine.decode(**kw)).tokens_repaired == 0
        with engine.workflow("repaired", repair="full"):
            assert (await engine.decode(**kw)).tokens_repaired == q2.length
            assert (await engine.decode(**kw, repair="none")).tokens_repaired == 0
        await rt.spawn(Full, "solver")
        assert (await rt.ask("solver", q2)).tokens_repaired == q2.length
        with pytest.raises(InvalidRequest, match="repair"):
            engine.workflow("bad", repair="most").__enter__()


async def test_the_leak_audit_still_flags_a_repaired_call(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama", leak_policy="allow") as engine:
        secret = await engine.prefill("always defect", owner="alice", visibility=Private())
        shared = await engine.prefill("hello world", parents=[secret], owner="alice")
        other = await engine.prefill("what now", owner="alice")
        await engine.decode(parents=[other, shared], max_tokens=2, owner="bob", repair="full")
        assert [leak.reader for leak in engine.leaks()] == ["bob"]


async def test_sixteen_repaired_calls_share_their_steps(tiny_dirs, monkeypatch):
    """Repair rows are prefill rows of the fused steps and their probes run batched in
    the first: sixteen parallel repaired calls (each its last question at an offset of
    its own, so no two repair the same context) take the steps and the probe passes
    one repaired call takes, not sixteen times as many."""
    from corps.engine.model.runner import ModelRunner

    passes, deviation = [], ModelRunner.deviation
    monkeypatch.setattr(ModelRunner, "deviation",
                        lambda self, items, layer: passes.append(len(items))
                        or deviation(self, items, layer))  # fmt: skip
    steps, probes = {}, {}
    for n in (1, 16):
        passes.clear()
        async with open_tiny(tiny_dirs, "llama", repair="recompute:0.15") as engine:
            sys = await engine.prefill(TEXTS[0], role="system")
            qs = await engine.prefill_many(
                [dict(message=f"question {i}: {TEXTS[1]}", parents=[sys]) for i in range(4)]
            )
            before = engine.stats()
            got = await engine.decode_many(
                [
                    dict(
                        parents=[sys, *qs],
                        offsets=[None] * 4 + [200 + i],
                        max_tokens=4,
                        ignore_eos=True,
                        seed=i,
                        temperature=1.0,
                    )
                    for i in range(n)
                ]
            )
            after = engine.stats()
            assert all(h.tokens_repaired > 0 for h in got)
            assert after.tokens_probed - before.tokens_probed == n * 3 * qs[1].length
            steps[n] = after.steps - before.steps
            probes[n] = list(passes)
    assert steps[16] == steps[1]
    assert probes == {1: [1], 16: [16]}  # one pass, every call's tokens in it


def test_a_batched_probe_measures_each_call_as_alone(tiny_dirs):
    """The probe of several calls in one pass gives each call the deviations it gets
    probed alone (float32), whatever its layout."""
    core = open_tiny(tiny_dirs, "llama").executor
    sys, q1, q2 = parallel(core)
    requests = [
        DecodeRequest(parents=[sys, q1, q2], sampling=greedy(2), repair="recompute:0.5"),
        DecodeRequest(parents=[sys, q2, q1], offsets=[0, 30, 60], sampling=greedy(2),
                      repair="recompute:0.3"),
        DecodeRequest(parents=[q2, sys], sampling=greedy(2), repair="recompute:0.7"),
    ]  # fmt: skip
    calls = [core.admit(Call(request=r)) for r in requests]
    try:
        items = [(c.view, c.repair.probe.ids, c.repair.probe.positions, c.repair.probe.every)
                 for c in calls]  # fmt: skip
        together = core.runner.deviation(items, 1)
        for item, dev in zip(items, together, strict=True):
            (alone,) = core.runner.deviation([item], 1)
            assert dev.shape == (len(item[1]),)
            torch.testing.assert_close(dev, alone, rtol=1e-5, atol=1e-5)
    finally:
        for c in calls:
            core.abort(c)
    core.check()


def query_scores_by_hand(core, view, ids, positions, at, every):
    """Layer 0 of `ModelRunner.query_attention`, a row and a head at a time: the
    softmax weight each query row's head pays each view key it may see, summed."""
    w, spec = core.runner.w, core.runner.spec
    lw, n = w.layers[0], view.length
    x = w.embed[torch.tensor(ids)].to(w.dtype)
    cos = w.rope.cos[torch.tensor(positions)].unsqueeze(1)
    sin = w.rope.sin[torch.tensor(positions)].unsqueeze(1)
    q, *_ = layer_qkv(x, lw.input_norm, lw.qkv, lw.q_norm, lw.k_norm, cos, sin,
                      spec.num_heads, spec.num_kv_heads, spec.rms_norm_eps)  # fmt: skip
    group = spec.num_heads // spec.num_kv_heads
    total = torch.zeros(n, device=x.device)
    for r, a in enumerate(at):
        seen = min(a, n - 1) + 1  # a row in the view sees up to itself; a new one all
        for h in range(spec.num_heads):
            keys = view.k_layers[0][h // group, :seen].float()  # (seen, D)
            weights = torch.softmax(keys @ q[r, h].float() * spec.head_dim**-0.5, 0)
            total[:seen] += weights
    return total[every]


def test_a_query_probe_scores_the_attention_the_query_pays_each_rewired_token(tiny_dirs):
    """`query:R`'s probe against a row-by-row, head-by-head reckoning (layer 0), and
    batched with another call's as alone; the rows it then recomputes are its top k."""
    core = open_tiny(tiny_dirs, "llama").executor
    sys, q1, q2 = parallel(core)
    requests = [
        DecodeRequest(parents=[sys, q1, q2], sampling=greedy(2), repair="query:0.4"),
        DecodeRequest(parents=[sys, q2, q1], offsets=[0, 30, 60], sampling=greedy(2),
                      repair="first:1+query:0.3"),
    ]  # fmt: skip
    calls = [core.admit(Call(request=r)) for r in requests]
    try:
        items = [(c.view, p.query.ids, p.query.positions, p.query.at, p.every)
                 for c in calls for p in [c.repair.probe]]  # fmt: skip
        assert all(len(ids) == QUERY_ROWS for _, ids, *_ in items)  # context tail + header
        together = core.runner.query_attention(items, 0)
        for item, got in zip(items, together, strict=True):
            torch.testing.assert_close(got, query_scores_by_hand(core, *item), rtol=1e-4,
                                       atol=1e-5)  # fmt: skip
            (alone,) = core.runner.query_attention([item], 1)
            (both,) = core.runner.query_attention([item, items[0]], 1)[:1]
            torch.testing.assert_close(both, alone, rtol=1e-5, atol=1e-5)
        scores = core.runner.query_attention(items, 1)
        core.repairs.probe(calls)  # as the call's first step does
        for c, score, (*_, every) in zip(calls, scores, items, strict=True):
            fixed = [] if c is calls[0] else [s for s, _ in core.repairs.ranges(c)]
            free = [j for j in range(len(every)) if every[j] not in fixed]
            k = c.repair.total - len(fixed)
            top = sorted(free, key=lambda j: -float(score[j]))[:k]
            assert sorted(c.repair.at) == sorted([*fixed, *(every[j] for j in top)])
    finally:
        for c in calls:
            core.abort(c)
    core.check()


def test_query_repairs_run_and_all_of_them_is_full(tiny_dirs):
    core = open_tiny(tiny_dirs, "llama").executor
    sys, q1, q2 = parallel(core)
    run = {}
    for repair in ("query:0.3", "query:1", "full"):
        (h,) = run_calls(core, [DecodeRequest(parents=[sys, q2, q1], sampling=greedy(6),
                                              repair=repair)])[0]  # fmt: skip
        run[repair] = h.generated
        assert len(h.generated) == 6
    assert run["query:1"] == run["full"]
    before = core.stats().tokens_probed
    run_calls(core, [DecodeRequest(parents=[sys, q2, q1], sampling=greedy(2), repair="query:0.3")])
    assert core.stats().tokens_probed - before == QUERY_ROWS  # its query rows, not the context
    core.check()


def test_a_temperature_scales_the_rewired_keys_the_call_reads(tiny_dirs):
    """temp:T leaves the store and other readers alone and divides the call's own
    copy of each rewired key by T (chosen tokens excepted: they are recomputed)."""
    core = open_tiny(tiny_dirs, "llama").executor
    sys, q1, q2 = parallel(core)
    parents = [sys, q1, q2]
    plain = core.admit(Call(request=DecodeRequest(parents=parents, sampling=greedy(2))))
    warm = core.admit(
        Call(request=DecodeRequest(parents=parents, sampling=greedy(2), repair="temp:0.5"))
    )
    mixed = repaired_view(
        core, DecodeRequest(parents=parents, sampling=greedy(2), repair="first:2+temp:0.5")
    )
    try:
        n = plain.view.ctx_len
        rewired = range(n - q2.length, n)
        before = range(n - q2.length)
        assert warm.repair is None  # nothing recomputed
        assert torch.equal(warm.view.k[:, :, before], plain.view.k[:, :, before])
        assert torch.equal(warm.view.v[:, :, :n], plain.view.v[:, :, :n])
        assert torch.allclose(warm.view.k[:, :, rewired], plain.view.k[:, :, rewired] / 0.5)
        tail = range(n - q2.length + 2, n)  # after the two recomputed ones
        assert mixed.repair.at == [n - q2.length, n - q2.length + 1]
        assert torch.allclose(mixed.view.k[:, :, tail], plain.view.k[:, :, tail] / 0.5)
    finally:
        for c in (plain, warm, mixed):
            core.abort(c)
    core.check()


async def test_an_evicted_repaired_encoding_is_recomputed_repaired(tiny_dirs):
    """A message whose call repaired its context is made again the same way when its
    evicted encoding is read: the same K/V, bit for bit (float32)."""
    from corps.engine.sched.policies import least_recent

    async with open_tiny(tiny_dirs, "llama") as engine:
        core = engine.executor  # internal: the store's slots and the eviction itself
        sys = await engine.prefill(TEXTS[0], role="system")
        q1 = await engine.prefill(TEXTS[1], parents=[sys])
        q2 = await engine.prefill(TEXTS[2], parents=[sys], offsets=[0])
        a = await engine.decode(parents=[sys, q1, q2], max_tokens=6, repair="first:3")
        msg = core.table.get(a.id)
        assert msg.repair == "first:3"
        slots = torch.tensor(msg.slots)
        before = core.memory.store.k[:, slots].clone(), core.memory.store.v[:, slots].clone()
        assert core.memory.evict(len(msg.slots), least_recent) > 0 and msg.evicted
        core.restorer.restore([a])
        slots = torch.tensor(msg.slots)
        assert same_encoding(core.memory.store.k[:, slots], before[0])
        assert same_encoding(core.memory.store.v[:, slots], before[1])
        core.check()


@pytest.mark.parametrize("policy", ["full", "recompute:0.3", "query:0.3", "first:2+temp:0.8"])
def test_calls_repairing_one_context_alike_share_one_repair(tiny_dirs, policy):
    """Six decodes over the same parents at the same offsets under one policy (a tree
    of thoughts' voters): the first recomputes the rewired tokens, the others wait for
    its rows and read its repaired context, recomputing nothing; each answers what a
    lone repaired call answers."""
    core = open_tiny(tiny_dirs, "llama").executor
    sys, q1, q2 = parallel(core)
    request = DecodeRequest(parents=[sys, q1, q2], sampling=greedy(4), repair=policy)
    (alone,), _ = run_calls(core, [request])
    before = core.stats()
    got, _ = run_calls(core, [request] * 6)
    after = core.stats()
    assert [h.tokens for h in got] == [alone.tokens] * 6
    assert sorted(h.tokens_repaired for h in got) == [0] * 5 + [alone.tokens_repaired]
    assert after.tokens_repaired - before.tokens_repaired == alone.tokens_repaired > 0
    core.check()


def test_a_call_waits_for_the_repair_it_would_share_and_builds_its_own_if_that_fails(
    tiny_dirs,
):
    """Admitted while another call still has repair rows to run over the context it
    would repair alike, a call is held (admit gives None: the loop tries it again
    after a step); once those rows ran it joins the repaired context; if the builder
    is given back first, it builds and repairs a context of its own. A call that
    cannot be held (`hold=False`) repairs a copy of its own at once."""
    core = open_tiny(tiny_dirs, "llama").executor
    sys, q1, q2 = parallel(core)
    request = DecodeRequest(parents=[sys, q1, q2], sampling=greedy(2), repair="full")
    builder = core.admit(Call(request=request), hold=True)
    assert builder.view.built and builder.repair.left > 0
    assert core.admit(Call(request=request), hold=True) is None  # its rows have not run
    own = core.admit(Call(request=request))  # no hold: a copy of its own
    assert own.view.built and own.repair is not None and own.view.ctx is not builder.view.ctx
    core.abort(own)
    core.abort(builder)  # given back with its rows unrun
    second = core.admit(Call(request=request), hold=True)
    assert second.view.built and second.repair.left > 0
    core.step(order([second]))  # its repair rows (and prompt) run
    assert second.repair.left == 0
    reader = core.admit(Call(request=request), hold=True)
    assert not reader.view.built and reader.repair is None and reader.repair_read == "full"
    assert reader.view.ctx is second.view.ctx
    for c in (reader, second):
        core.abort(c)
    core.check()


def test_a_plain_reader_never_reads_a_repaired_context(tiny_dirs):
    """A call over the same slots at the same positions without a repair reads the
    context as stored, not the one a repaired call rewrote, running beside it."""
    core = open_tiny(tiny_dirs, "llama").executor
    sys, q1, q2 = parallel(core)
    plain = DecodeRequest(parents=[sys, q1, q2], sampling=greedy(3))
    (alone,), _ = run_calls(core, [plain])
    repaired = DecodeRequest(parents=[sys, q1, q2], sampling=greedy(3), repair="full")
    got, _ = run_calls(core, [repaired, plain, repaired, plain])
    assert got[1].tokens == got[3].tokens == alone.tokens
    assert got[1].tokens_repaired == got[3].tokens_repaired == 0
    core.check()


async def test_readers_of_a_shared_repair_outlive_its_builder(tiny_dirs):
    """The call that built a repaired context is cancelled while three readers of it
    decode: they finish with what a lone repaired call decodes, and the store keeps
    no slot of the cancelled call."""
    import anyio

    async with open_tiny(tiny_dirs, "llama") as engine:
        sys = await engine.prefill(TEXTS[0], role="system")
        q1 = await engine.prefill(TEXTS[1], parents=[sys])
        q2 = await engine.prefill(TEXTS[2], parents=[sys], offsets=[0])
        ask = dict(parents=[sys, q1, q2], ignore_eos=True, repair="full")
        reference = await engine.decode(max_tokens=12, **ask)
        engine.free(reference)
        messages = engine.stats().messages
        started, readers, built = [anyio.Event() for _ in range(3)], {}, anyio.Event()

        async def builder(scope: anyio.CancelScope) -> None:
            with scope:
                async with engine.stream(max_tokens=400, **ask) as stream:
                    async for _ in stream:
                        built.set()  # its repair rows have run
                        if all(e.is_set() for e in started):
                            scope.cancel()  # amid its readers
                            await anyio.lowlevel.checkpoint()

        async def reader(i: int) -> None:
            stream = engine.stream(max_tokens=12, **ask)
            async for _ in stream:
                started[i].set()
            readers[i] = stream.handle

        scope = anyio.CancelScope()
        async with anyio.create_task_group() as tg:
            tg.start_soon(builder, scope)
            await built.wait()
            for i in range(3):
                tg.start_soon(reader, i)
        assert scope.cancel_called
        assert [readers[i].tokens for i in range(3)] == [reference.tokens] * 3
        assert sorted(readers[i].tokens_repaired for i in range(3)) == [0, 0, 0]
        for h in readers.values():
            engine.free(h)
        await engine.prefill("x")  # one more trip through the loop reaps the cancelled call
        stats = engine.stats()
        assert stats.messages == messages + 1
        assert stats.tokens_used == sum(m.slots for m in engine.messages())
