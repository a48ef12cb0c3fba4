"""Exactness of prompt choreography (corps.engine.exec.kv_executor) against HF transformers."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.nn.attention.bias import CausalBias

from corps.engine.attention.views import open_view
from corps.engine.exec.call import Call
from corps.engine.request.requests import DecodeRequest, PrefillRequest
from corps.engine.request.sampling_params import SamplingParams

from conftest import batch_rounding, open_tiny, same_encoding
from helpers import Oracle, build_mask, order, run_calls

TOL = 1e-4


def prefill(core, message, **kw):
    (h,), logits = run_calls(core, [PrefillRequest(message, **kw)], want_logits=True)
    return h, logits[0]


def greedy(n, **kw):
    return SamplingParams(max_tokens=n, ignore_eos=True, **kw)


@pytest.mark.parametrize("arch", ["llama", "llama3-scaled", "qwen2", "qwen3", "llama-sink"])
def test_chain_equivalence_logits_and_greedy(tiny_dirs, tiny_hf, arch, backend):
    """Each message attends to all earlier ones in order: identical to HF on the concatenation."""
    core = open_tiny(tiny_dirs, arch).executor
    hf = tiny_hf[arch]
    texts = [
        ("system", "you are a careful solver"),
        ("user", "what is seven times six"),
        ("assistant", "the quick brown fox"),
        ("user", "hello world"),
    ]
    handles, ours = [], []
    for role, text in texts:
        h, logits = prefill(core, text, role=role, parents=handles)
        handles.append(h)
        ours.append(logits)
    seq = core.fmt.sink + [t for h in handles for t in h.tokens]
    ref = hf(torch.tensor([seq], device=hf.device)).logits[0][len(core.fmt.sink) :]
    assert (torch.cat(ours) - ref).abs().max().item() <= TOL

    (ans,) = run_calls(core, [DecodeRequest(parents=handles, sampling=greedy(12))])[0]
    footer = core.fmt.encode(core.fmt.frame("assistant")[1])
    header = ans.tokens[: len(ans.tokens) - 12 - len(footer)]
    prompt = torch.tensor([seq + header], device=hf.device)
    hf.generation_config.eos_token_id = None
    out = hf.generate(prompt, max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=0)
    assert ans.generated == out[0, prompt.shape[1] :].tolist()
    # Cut by max_tokens, the turn is still closed with the whole footer, and the next
    # turn reads it exactly as HF encodes the rendered conversation.
    assert ans.tokens == header + ans.generated + footer
    nxt, logits = prefill(core, "hello world", parents=[*handles, ans])
    seq2 = seq + ans.tokens + nxt.tokens
    ref = hf(torch.tensor([seq2], device=hf.device)).logits[0][-nxt.length :]
    assert (logits - ref).abs().max().item() <= TOL


def test_repositioning_keys_and_attention(tiny_dirs, backend):
    """A message encoded at one offset and used at another equals one encoded there directly."""
    core = open_tiny(tiny_dirs, "llama").executor
    x_a, _ = prefill(core, "the quick brown fox", new_offset=3)
    x_b, _ = prefill(core, "the quick brown fox", new_offset=57)
    n = x_a.length
    dev = core.memory.store.k.device
    pos = torch.arange(57, 57 + n, device=dev)
    slots_a = torch.tensor(core.table.get(x_a.id).slots, device=dev)
    slots_b = torch.tensor(core.table.get(x_b.id).slots, device=dev)
    fill = core.runner.attention.gather  # the backend's gather (a Triton kernel or torch)
    view_a = open_view(core.memory.store, core.memory.rope, slots_a, pos, 0, fill=fill)
    view_b = open_view(core.memory.store, core.memory.rope, slots_b, pos, 0, fill=fill)
    assert (view_a.k - view_b.k).abs().max().item() <= 1e-5
    assert (view_a.v - view_b.v).abs().max().item() <= 1e-5
    _, la = prefill(core, "what is seven", parents=[x_a], offsets=[57])
    _, lb = prefill(core, "what is seven", parents=[x_b], offsets=[57])
    assert (la - lb).abs().max().item() <= 1e-5


def test_concurrent_placements_of_one_parent_are_both_correct(tiny_dirs, tiny_hf, backend):
    """Two calls in one parallel batch place the same parent at different offsets."""
    core = open_tiny(tiny_dirs, "llama").executor
    oracle = Oracle(tiny_hf["llama"])
    p, _ = prefill(core, "you are a careful solver")
    oracle.encode(p.id, p.tokens, [], 0)
    reqs = [PrefillRequest("hello world", parents=[p], offsets=[off]) for off in (0, 40)]
    handles, logits = run_calls(core, reqs, want_logits=True)
    for h, off, got in zip(handles, (0, 40), logits, strict=True):
        want = oracle.encode(h.id, h.tokens, [(p.id, off)], off + p.length)
        assert (got - want).abs().max().item() <= TOL


def test_calls_over_one_context_share_it_and_stay_exact(tiny_dirs, tiny_hf, backend):
    """Concurrent calls placing the same parents at the same offsets read one rotated
    copy of that context (held once), and each still matches transformers."""
    core = open_tiny(tiny_dirs, "llama").executor
    core.runner.group_min_saved = 1  # tiny contexts: group them anyway
    oracle = Oracle(tiny_hf["llama"])
    a, _ = prefill(core, "you are a careful solver")
    oracle.encode(a.id, a.tokens, [], 0)
    b, _ = prefill(core, "what is seven times six", parents=[a])
    oracle.encode(b.id, b.tokens, [(a.id, 0)], a.length)
    texts = ("hello world", "the quick brown fox jumps", "seven")
    reqs = [PrefillRequest(t, parents=[a, b]) for t in texts]
    handles, logits = run_calls(core, reqs, want_logits=True)
    context = a.length + b.length
    own = sum(h.length for h in handles)
    if backend == "store":  # the context stays in the store: one layer of it in the scratch
        assert (core.stats().view_tokens_peak, core.stats().scratch_tokens_peak) == (own, context)
    else:  # one context plus each call's own tokens, not three contexts
        assert core.stats().view_tokens_peak == context + own
    for h, got in zip(handles, logits, strict=True):
        want = oracle.encode(h.id, h.tokens, [(a.id, 0), (b.id, a.length)], context)
        assert (got - want).abs().max().item() <= TOL
    reqs = [
        DecodeRequest(parents=[a, b], header=t, sampling=greedy(n))
        for t, n in (("so", 9), ("the", 5), ("it", 12), ("we", 7))
    ]
    together = run_calls(core, reqs)[0]
    alone = [run_calls(core, [r])[0][0] for r in reqs]
    for t, s in zip(together, alone, strict=True):
        if t.tokens != s.tokens:  # only where transformers' top two are within rounding
            pairs = enumerate(zip(t.tokens, s.tokens, strict=False))
            i = next((k for k, (x, y) in pairs if x != y), min(t.length, s.length))
            ctx = [(a.id, 0), (b.id, a.length)]
            top2 = oracle.encode(s.id, s.tokens, ctx, context)[i - 1].topk(2).values
            assert top2[0] - top2[1] < 1e-3, f"a batch changed token {i} past a near-tie"
    assert (
        core.stats().view_tokens == core.stats().scratch_tokens == 0
        and len(core.memory.contexts) == 0
    )


def test_decode_many_equals_sequential(tiny_dirs, backend):
    core = open_tiny(tiny_dirs, "qwen3").executor
    sys_h, _ = prefill(core, "you are a careful solver", role="system")
    q1, _ = prefill(core, "what is seven times six", parents=[sys_h])
    q2, _ = prefill(core, "hello world", parents=[sys_h])
    reqs = [
        DecodeRequest(parents=[sys_h, q1], sampling=greedy(10)),
        DecodeRequest(parents=[sys_h, q2], header="the", sampling=greedy(7)),
        DecodeRequest(parents=[q2, q1], offsets=[20, 3], sampling=greedy(9)),
    ]
    together = run_calls(core, reqs)[0]
    alone = [run_calls(core, [r])[0][0] for r in reqs]
    assert [h.tokens for h in together] == [h.tokens for h in alone]
    # each call's generated tokens sit in slots reserved for it at admission, apart
    slots = [set(core.table.get(h.id).slots) for h in together]
    assert not slots[0] & slots[1] and not slots[1] & slots[2] and not slots[0] & slots[2]


def test_prefill_many_equals_sequential(tiny_dirs, backend):
    core = open_tiny(tiny_dirs, "qwen2").executor
    base, _ = prefill(core, "you are a careful solver", role="system")
    reqs = [
        PrefillRequest("what is seven", parents=[base]),
        PrefillRequest("hello world, how are you", parents=[base], offsets=[9]),
        PrefillRequest("the lazy dog", role="assistant"),
    ]
    _, together = run_calls(core, reqs, want_logits=True)
    alone = [run_calls(core, [r], want_logits=True)[1][0] for r in reqs]
    for a, b in zip(together, alone, strict=True):
        assert (a - b).abs().max().item() <= batch_rounding()


@pytest.mark.parametrize("arch", ["llama", "llama-sink"])
def test_modes_agree_on_a_single_chain(tiny_dirs, arch):
    outs = []
    for mode in ("choreographed", "baseline"):
        core = open_tiny(tiny_dirs, arch, mode=mode).executor
        (s,), _ = run_calls(core, [PrefillRequest("you are a careful solver", role="system")])
        (q,), _ = run_calls(core, [PrefillRequest("what is seven times six", parents=[s])])
        (a,) = run_calls(core, [DecodeRequest(parents=[s, q], sampling=greedy(16))])[0]
        outs.append(a.tokens)
    assert outs[0] == outs[1]


def test_overlapping_parents_mask(tiny_dirs, tiny_hf, backend):
    """Two parents at the same offset (MultiQA 'parallel' layout): masked exactly as specified."""
    core = open_tiny(tiny_dirs, "llama").executor
    oracle = Oracle(tiny_hf["llama"])
    a, _ = prefill(core, "what is seven times six")
    b, _ = prefill(core, "the quick brown fox")
    for h in (a, b):
        oracle.encode(h.id, h.tokens, [], 0)
    req = PrefillRequest("hello world", parents=[a, b], offsets=[2, 2])
    call = Call(request=req)
    core.planner.prefill(call, req)
    assert call.ctx_slots == core.table.get(a.id).slots + core.table.get(b.id).slots
    assert call.ctx_pos == list(range(2, 2 + a.length)) + list(range(2, 2 + b.length))
    c, got = prefill(core, "hello world", parents=[a, b], offsets=[2, 2])
    # The reference mask over the whole store agrees with what the call attended to.
    msgs = {s: m.id for m in core.table.all() for s in m.slots}
    slot_msgs = torch.tensor([msgs.get(s, -1) for s in range(core.memory.store.capacity)])
    slot_pos = torch.full((core.memory.store.capacity,), 10**6)
    for m in core.table.all():
        slot_pos[m.slots] = torch.arange(len(m.slots))
    qpos = torch.arange(c.length)
    mask = build_mask(
        torch.full((c.length,), c.id), [{a.id, b.id}] * c.length, qpos, slot_msgs, slot_pos
    )
    seen = set(call.ctx_slots)
    own = core.table.get(c.id).slots
    for i in range(c.length):
        assert set(torch.nonzero(mask[i]).flatten().tolist()) == seen | set(own[: i + 1])
    want = oracle.encode(c.id, c.tokens, [(a.id, 2), (b.id, 2)], 2 + max(a.length, b.length))
    assert (got - want).abs().max().item() <= TOL


@st.composite
def choreographies(draw):
    """Groups of messages; each group is prefilled in parallel and attends to earlier groups."""
    groups, n = [], 0
    for _ in range(draw(st.integers(1, 4))):
        group = []
        for _ in range(draw(st.integers(1, 3))):
            parents = draw(
                st.permutations(range(n)).map(lambda p: p[: draw(st.integers(0, len(p)))])
            )
            offsets = [draw(st.one_of(st.none(), st.integers(0, 40))) for _ in parents]
            new_offset = draw(st.one_of(st.none(), st.integers(0, 80)))
            tokens = draw(st.lists(st.integers(5, 300), min_size=1, max_size=6))
            group.append((tokens, parents, offsets, new_offset))
        n += len(group)
        groups.append(group)
    return groups


@pytest.mark.parametrize("arch", ["llama", "qwen3", "llama-sink"])
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(groups=choreographies())
def test_random_choreographies_match_brute_force(tiny_dirs, tiny_hf, arch, groups, backend):
    core = open_tiny(tiny_dirs, arch).executor
    oracle = Oracle(tiny_hf[arch])
    sink = []
    if core.sink is not None:
        oracle.encode(core.sink.id, core.sink.tokens, [], 0)
        sink = [(core.sink.id, 0)]
    handles = []
    for group in groups:
        reqs = [
            PrefillRequest(
                tok,
                frame=False,
                parents=[handles[p] for p in parents],
                offsets=offsets,
                new_offset=new,
            )
            for tok, parents, offsets, new in group
        ]
        made, logits = run_calls(core, reqs, want_logits=True)
        for h, got in zip(made, logits, strict=True):
            msg = core.table.get(h.id)
            placed = sink + list(zip(msg.parents, msg.parent_offsets, strict=True))
            want = oracle.encode(h.id, msg.tokens, placed, msg.offset)
            assert (got - want).abs().max().item() <= TOL
        handles += made


class _OneDevice(torch.overrides.TorchFunctionMode):
    """Fails any torch op that mixes tensors of two devices (0-dim CPU scalars aside)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        devices = {
            t.device.type
            for t in torch.utils._pytree.tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor)
            and not (t.device.type == "cpu" and t.dim() == 0)
            and not isinstance(t, CausalBias)  # a shape, no data: SDPA places it
        }
        assert len(devices) <= 1, f"{func} mixes devices {devices}"
        return func(*args, **kwargs)


@pytest.mark.parametrize("mode", ["choreographed", "baseline"])
def test_engine_runs_on_a_device_without_touching_cpu_tensors(
    tiny_dirs, tiny_hf, mode, monkeypatch
):
    """CI has no GPU: run every path on the meta device and fail any op mixing devices."""
    from transformers import AutoTokenizer

    from corps.engine.exec.kv_executor import KVExecutor
    from corps.engine.model.weights import read_spec, weights_from_hf

    path = tiny_dirs["llama-sink"]
    weights = weights_from_hf(tiny_hf["llama-sink"], read_spec(path), device="meta")
    # Meta tensors hold no values: sampling (which reads one) picks a fixed token.
    monkeypatch.setattr("corps.engine.exec.sampler.sample", lambda logits, params, gen, i: 7)
    monkeypatch.setattr(
        "corps.engine.exec.sampler.argmax_rows", lambda logits: [7] * logits.shape[0]
    )
    with _OneDevice():
        core = KVExecutor(
            weights, AutoTokenizer.from_pretrained(str(path)), model_path=path, mode=mode
        )
        a, logits = prefill(core, "hello world")
        b, _ = prefill(core, "the quick brown fox", parents=[a], offsets=[9])
        (c,) = run_calls(core, [DecodeRequest(parents=[a, b], sampling=greedy(3))])[0]
        d, _ = prefill(core, "what is seven", parents=[a, b, c])
        core.free(b)
    assert logits.device.type == "meta" and core.device.type == "meta"
    assert c.generated == [7, 7, 7] and d.length > 0


# ---- baseline: prefixes shared among concurrent calls (in-batch) ----


def test_prefills_keep_a_share_of_every_step_under_a_full_batch_of_decodes(tiny_dirs):
    core = open_tiny(tiny_dirs, "llama").executor
    q, _ = prefill(core, "count with me")
    decodes = [
        core.admit(Call(request=DecodeRequest(parents=[q], sampling=greedy(20)))) for _ in range(8)
    ]
    while any(c.pending is None for c in decodes):  # encode their headers first
        core.step(order(decodes, None))
    long = core.admit(Call(request=PrefillRequest(list(range(5, 205)), frame=False)))
    # a budget of 8 is all taken by the 8 decodes, unless prefills keep their share
    for _ in range(3):
        fed = long.fed
        out = core.step(order([*decodes, long], 8))
        assert long.fed == fed + 1  # 8 // PREFILL_SHARE = 1 token for the prefill
        assert len(out.tokens) == 7  # the decodes that fit; the last one waits a step
    for c in [*decodes, long]:
        core.abort(c)
    assert core.memory.store.used_slots == len(core.table.get(q.id).slots)


def test_a_step_reports_the_keys_its_decodes_read(tiny_dirs):
    """The step cost's keys (`decode_keys`): one-row calls count their views with the
    token each adds; prompt chunks do not."""
    core = open_tiny(tiny_dirs, "llama").executor
    short, _ = prefill(core, "count")
    long_, _ = prefill(core, "count with me from one to ten and then back down to one")
    decodes = [
        core.admit(Call(request=DecodeRequest(parents=[p], sampling=greedy(4))))
        for p in (short, long_)
    ]
    while any(c.pending is None for c in decodes):  # encode their headers first
        core.step(order(decodes, None))
    chunk = core.admit(Call(request=PrefillRequest(list(range(5, 45)), frame=False)))
    want = sum(c.view.length + 1 for c in decodes)
    out = core.step(order([*decodes, chunk], None))
    assert out.chunks == 1 and out.keys == want
    for c in [*decodes, chunk]:
        core.abort(c)


def test_mixed_steps_batch_decodes_and_prefill_chunks_and_agree_with_alone(tiny_dirs, backend):
    """Decodes already running while other calls prefill: each step fuses one batched
    decode with the prefill chunks, and every call ends as it does alone."""
    core = open_tiny(tiny_dirs, "qwen3").executor
    core.runner.group_min_saved = 1  # the shared-context groups take part too
    q, _ = prefill(core, "count with me")
    r, _ = prefill(core, "what is seven times six")
    reqs = [DecodeRequest(parents=[q], header=h, sampling=greedy(12)) for h in ("one", "two")]
    reqs.append(DecodeRequest(parents=[r], sampling=greedy(12)))
    late = [
        DecodeRequest(parents=[q, r], header="hello world " * 6, sampling=greedy(8)),
        PrefillRequest("the lazy dog sleeps", parents=[r]),
    ]
    alone_dec = [run_calls(core, [x])[0][0].tokens for x in [*reqs, late[0]]]
    (_,), (alone_pre,) = run_calls(core, [late[1]], want_logits=True)
    calls = [core.admit(Call(request=x)) for x in reqs]
    made = {}  # call -> the handle the step that finished it returned
    while any(c.pending is None for c in calls):
        made.update(core.step(order(calls, None)).finished)
    made.update(core.step(order(calls, None)).finished)  # the decodes are running
    calls += [
        core.admit(Call(request=late[0])),
        core.admit(Call(request=late[1], want_logits=True)),
    ]
    mixed = 0
    while not all(c.done for c in calls):
        live = [c for c in calls if not c.done]
        decoding = [c for c in live if c.pending is not None]
        mixed += bool(decoding) and len(decoding) < len(live)
        made.update(
            core.step(order(live, 4 + len(decoding))).finished
        )  # prefills take a few chunks
    assert mixed >= 2
    handles = [made[c] for c in calls]
    assert [h.tokens for h in handles[:4]] == alone_dec
    assert (torch.cat(calls[4].logits) - alone_pre).abs().max().item() <= 1e-5


# ---- preemption: an evicted encoding is made again, bit for bit (float32) ----


def _kv(core, msg):
    slots = torch.tensor(msg.slots)
    return core.memory.store.k[:, slots].clone(), core.memory.store.v[:, slots].clone()


@pytest.mark.parametrize("arch", ["llama", "qwen3", "llama-sink"])
async def test_an_evicted_encoding_is_recomputed_bit_for_bit(tiny_dirs, arch):
    """Prefills and a decode (its steps replayed: header, then a token a step, then its
    last token with the footer), over a parent that was freed meanwhile (made again
    only to be read, then given back)."""
    from corps.engine.sched.policies import least_recent

    async with open_tiny(tiny_dirs, arch) as engine:
        core = engine.executor
        sys_ = await engine.prefill("You answer in one word. " * 4, role="system")
        q = await engine.prefill("What colour is the sky?", parents=[sys_], offsets=[3])
        a = await engine.decode(parents=[sys_, q], max_tokens=12, ignore_eos=True)
        msgs = [core.table.get(h.id) for h in (sys_, q, a)]
        before = [_kv(core, m) for m in msgs]
        assert msgs[2].spans[1:-1] == (1,) * (len(msgs[2].spans) - 2)  # a token a step
        used = core.memory.store.used_slots
        assert core.memory.evict(sum(len(m.slots) for m in msgs), least_recent) > 0
        assert all(m.evicted and not m.slots for m in msgs)
        engine.free(sys_)  # its record stays: q and a were encoded over it
        core.restorer.restore([a])
        assert not msgs[1].evicted and not msgs[2].evicted
        assert not msgs[0].slots  # made again only to be read, and given back
        for m, (k, v) in zip(msgs[1:], before[1:], strict=True):
            k2, v2 = _kv(core, m)
            assert same_encoding(k, k2) and same_encoding(v, v2)
        assert core.memory.store.used_slots == used - len(msgs[0].tokens)
        stats = engine.stats()
        assert stats.tokens_recomputed == sum(len(m.tokens) for m in msgs)
        assert stats.messages_evicted == 3
        core.check()
