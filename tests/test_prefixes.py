"""engine/exec/prefixes.py: the baseline's radix tree, shared among concurrent calls."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corps.engine.exec.call import Call
from corps.engine.request.requests import DecodeRequest, PrefillRequest
from corps.engine.request.sampling_params import SamplingParams

from conftest import open_tiny
from helpers import order, run_calls

TOL = 1e-4


def greedy(n, **kw):
    return SamplingParams(max_tokens=n, ignore_eos=True, **kw)


def _tree_slots(radix) -> list[int]:
    return [s for n in radix._nodes() for s in n.slots]


def _check_tree(core, running) -> None:
    """Locks count exactly the running calls; every slot has exactly one owner."""
    radix = core.memory.prefixes.radix
    for node in radix._nodes():
        if node is radix.root:
            continue
        users = 0
        for c in running:
            walk = c.lock
            while walk is not None and walk is not node:
                walk = walk.parent
            users += walk is node
        assert node.lock == users
    owned = _tree_slots(radix) + [s for c in running for s in c.slots[c.cached :] + c.spare]
    assert len(owned) == len(set(owned)) == core.memory.store.used_slots
    assert len(set(core.memory.store._free)) == len(
        core.memory.store._free
    )  # nothing released twice


@st.composite
def concurrent_baseline_calls(draw):
    """Calls over a few long shared stems, arriving at random steps, some aborted."""
    stems = [draw(st.lists(st.integers(10, 300), min_size=40, max_size=70)) for _ in range(2)]
    calls = []
    for _ in range(draw(st.integers(2, 6))):
        calls.append(
            dict(
                stem=draw(st.integers(0, 1)),
                tail=draw(st.lists(st.integers(10, 300), min_size=1, max_size=4)),
                decode=draw(st.booleans()),
                arrive=draw(st.integers(0, 3)),
                abort=draw(st.none() | st.integers(0, 6)),
            )
        )
    return stems, calls, draw(st.sampled_from([None, 40]))


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(work=concurrent_baseline_calls())
def test_baseline_shares_prefixes_among_concurrent_calls(tiny_dirs, tiny_hf, work):
    """Held calls reuse what a running call encodes; locks and slots stay exact; a call
    that fails takes back what it inserted; greedy outputs are HF's."""
    stems, specs, budget = work
    core = open_tiny(tiny_dirs, "llama", mode="baseline").executor
    hf = tiny_hf["llama"]
    parents = [run_calls(core, [PrefillRequest(s, frame=False)])[0][0] for s in stems]
    waiting, running, finished = [], [], []
    for step in range(40):
        waiting += [s for s in specs if s["arrive"] == step]
        for spec in list(waiting):
            parent = [parents[spec["stem"]]]
            if spec["decode"]:
                req = DecodeRequest(parent, header=spec["tail"], frame=False, sampling=greedy(3))
                call = core.admit(Call(request=req), hold=bool(running))
            else:
                req = PrefillRequest(spec["tail"], parents=parent, frame=False)
                call = core.admit(Call(request=req, want_logits=True), hold=bool(running))
            if call is not None:
                waiting.remove(spec)
                running.append(call)
                call.spec = spec
        for c in [c for c in running if c.spec["abort"] == step]:
            before = set(_tree_slots(core.memory.prefixes.radix))
            core.abort(c)
            running.remove(c)
            if not running:  # nobody else can use its inserts: the tree holds no new slot
                assert set(_tree_slots(core.memory.prefixes.radix)) <= before
        _check_tree(core, running)
        if not running and not waiting and step > 3:
            break
        out = core.step(order([c for c in running if not c.done], budget))
        assert not out.failed
        for c in [c for c in running if c.done]:
            running.remove(c)
            finished.append((c.spec, c.plan.prefix, out.finished[c]))
        _check_tree(core, running)
    assert not running and not waiting
    assert all(n.lock == 0 for n in core.memory.prefixes.radix._nodes())
    for spec, prompt, h in finished:
        if spec["decode"]:
            hf.generation_config.eos_token_id = None
            out = hf.generate(torch.tensor([prompt]), max_new_tokens=3, do_sample=False)
            assert h.generated == out[0, len(prompt) :].tolist()


def test_baseline_call_that_fails_takes_back_the_prefix_it_shared(tiny_dirs):
    core = open_tiny(tiny_dirs, "llama", mode="baseline").executor
    (stem,), _ = run_calls(core, [PrefillRequest(list(range(20, 80)), frame=False)])
    used = core.memory.store.used_slots

    def decode(tail):
        req = DecodeRequest([stem], header=tail, frame=False, sampling=greedy(4))
        return core.admit(Call(request=req), hold=True)

    a = decode([5])
    core.step(order([a], None))  # a's prompt is encoded and cached; a samples its first token
    assert core.memory.prefixes.radix.size == 61
    b = decode([6])  # shares a's 60 stem tokens, which are cached already: not held
    assert b is not None and b.feed == [6] and len(b.ctx_slots) == 60
    core.abort(a)
    assert (
        core.memory.prefixes.radix.size == 60
    )  # b still reads a's stem: it stays; a's own token goes
    core.abort(b)
    assert (
        core.memory.prefixes.radix.size == 0 and core.memory.store.used_slots == used
    )  # as if neither ran


async def test_a_cache_salt_reuses_only_its_own_prefixes(tiny_dirs):
    """Baseline: a decode finds the prompt a call with its salt cached, and nothing of a
    call with another salt (or none): tenants cannot learn each other's prompts from
    cache hits. The tokens are the same either way (float32)."""
    async with open_tiny(tiny_dirs, "llama", mode="baseline") as engine:
        q = await engine.prefill("a long question about the vault and its code")

        async def ask(salt):
            return await engine.decode(parents=[q], max_tokens=3, temperature=0, cache_salt=salt)

        first = await ask("tenant-a")
        other, unsalted = await ask("tenant-b"), await ask(None)
        again = await ask("tenant-a")
        assert first.tokens_reused == other.tokens_reused == unsalted.tokens_reused == 0
        assert again.tokens_reused > 0
        assert first.tokens == other.tokens == unsalted.tokens == again.tokens
        engine.check()
