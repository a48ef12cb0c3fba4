"""An adapter kept apart (corps.engine.model.adapter_rows): scope "rewired", served and replayed."""

from __future__ import annotations

import pytest
import torch

from corps.engine.distill.differentiable import DifferentiableReplay
from corps.engine.errors import BadAdapter
from corps.engine.model.adapter_files import SCOPE_FILE, read_scope, write_scope
from corps.engine.model.adapter_rows import Factors, stacked

from conftest import open_tiny
from helpers import LOGPROBS, choreographed_workflow, hf_model, peft_adapter


def test_stacked_factors_give_each_members_product_in_its_rows():
    torch.manual_seed(0)
    q = Factors(torch.randn(2, 6), torch.randn(4, 2))
    v = Factors(torch.randn(3, 6), torch.randn(5, 3))
    a, b = stacked([q, None, v], [4, 2, 5])  # k has no adapter
    x = torch.randn(7, 6)
    got = (x @ a.T) @ b.T  # (7, 11)
    want = torch.cat([(x @ q.a.T) @ q.b.T, torch.zeros(7, 2), (x @ v.a.T) @ v.b.T], dim=1)
    assert torch.allclose(got, want, atol=1e-6)


@pytest.mark.parametrize(
    "arch, copy", [("llama", True), ("llama", False), ("llama-sink", True), ("qwen2", True)]
)
async def test_an_adapter_of_scope_rewired_applies_to_rewired_calls_only(
    tiny_dirs, tmp_path, arch, copy
):
    # copy: the lone rewired call's steps run on the merged weights (the siblings'
    # shared step, one chain row and one rewired, always adds the low-rank product)
    lora = peft_adapter(tiny_dirs[arch], tmp_path / "a")
    write_scope(tmp_path / "a", "rewired")
    async with open_tiny(tiny_dirs, arch, adapter=tmp_path / "a", adapter_copy=copy) as engine:
        handles = await choreographed_workflow(engine)
        system, q1 = handles[:2]
        chain = await engine.decode(parents=[system, q1], seed=9, **LOGPROBS)
        graph = engine.graph([*handles, chain])
    decodes = [*handles[3:], chain]
    served = DifferentiableReplay(lora, scope="rewired").run(graph)
    base = DifferentiableReplay(hf_model(tiny_dirs[arch])).run(graph)
    for h in decodes:  # the engine computes what the replay under the same scope does
        assert served.logprobs[h.id].tolist() == pytest.approx(list(h.logprobs), abs=1e-4)
    # chain calls ran the base model (the first answer too: its question is the longer,
    # so it sits right after it); the rewired ones (over both questions, or moved) not
    a1, a2, final = handles[3:]
    assert q1.length > handles[2].length
    for h in (chain, a1):
        assert base.logprobs[h.id].tolist() == pytest.approx(list(h.logprobs), abs=1e-5)
    for h in (a2, final):
        assert (base.logprobs[h.id] - torch.tensor(h.logprobs)).abs().max() > 1e-3


async def test_the_merged_copy_is_held_in_choreographed_mode_only(tiny_dirs, tmp_path):
    peft_adapter(tiny_dirs["llama"], tmp_path / "a")
    write_scope(tmp_path / "a", "rewired")
    held = {}
    for mode, copy in (("choreographed", True), ("choreographed", False), ("baseline", True)):
        kw = dict(adapter=tmp_path / "a", adapter_copy=copy, mode=mode)
        async with open_tiny(tiny_dirs, "llama", **kw) as engine:
            held[mode, copy] = engine.stats().weight_bytes
    async with open_tiny(tiny_dirs, "llama") as engine:
        bare = engine.stats().weight_bytes
    factors = held["choreographed", False] - bare  # the factors only
    assert 0 < factors < held["choreographed", True] - held["choreographed", False]
    assert held["baseline", True] == held["choreographed", False]


@pytest.mark.parametrize("mode", ["baseline", "hf"])
async def test_in_baseline_modes_no_call_is_rewired(tiny_dirs, tmp_path, mode):
    peft_adapter(tiny_dirs["llama"], tmp_path / "a")
    write_scope(tmp_path / "a", "rewired")
    got = []
    for adapter in (tmp_path / "a", None):
        async with open_tiny(tiny_dirs, "llama", adapter=adapter, mode=mode) as engine:
            q = await engine.prefill("hello world")
            h = await engine.decode(parents=[q], force=[7, 8, 9], logprobs=True)
            got.append(list(h.logprobs))
    assert got[0] == pytest.approx(got[1], abs=1e-5)


async def test_the_compiled_step_leaves_adapted_calls_to_the_eager_step(tiny_dirs, tmp_path):
    peft_adapter(tiny_dirs["llama"], tmp_path / "a")
    write_scope(tmp_path / "a", "rewired")

    async def run(engine):
        handles = await choreographed_workflow(engine)
        system, q1 = handles[:2]
        return [*handles[3:], await engine.decode(parents=[system, q1], seed=9, **LOGPROBS)]

    async with open_tiny(tiny_dirs, "llama", adapter=tmp_path / "a") as eager:
        handles = await run(eager)
    async with open_tiny(tiny_dirs, "llama", adapter=tmp_path / "a", compile=True) as engine:
        again = await run(engine)
        assert engine.stats().compiled_steps > 0  # the lone chain call's steps
    for a, b in zip(handles, again, strict=True):
        assert list(b.logprobs) == pytest.approx(list(a.logprobs), abs=1e-4)


def test_the_scope_file(tmp_path):
    peft_dir = tmp_path / "a"
    peft_dir.mkdir()
    assert read_scope(peft_dir) == "all"
    write_scope(peft_dir, "rewired")
    assert read_scope(peft_dir) == "rewired"
    write_scope(peft_dir, "all")
    assert not (peft_dir / SCOPE_FILE).exists()
    (peft_dir / SCOPE_FILE).write_text('{"scope": "some"}')
    with pytest.raises(BadAdapter, match="names scope 'some'"):
        read_scope(peft_dir)
    (peft_dir / SCOPE_FILE).write_text("{")
    with pytest.raises(BadAdapter, match="unreadable"):
        read_scope(peft_dir)


async def test_a_bad_scope_file_fails_before_loading(tiny_dirs, tmp_path):
    peft_adapter(tiny_dirs["llama"], tmp_path / "a")
    (tmp_path / "a" / SCOPE_FILE).write_text('{"scope": "nowhere"}')
    with pytest.raises(BadAdapter, match="nowhere"):
        async with open_tiny(tiny_dirs, "llama", adapter=tmp_path / "a"):
            pass


def test_a_gated_projection_reads_as_its_base_and_adds_only_on_the_gates_rows():
    import copy

    from corps.engine.model.adapter_rows import GatedLoRA, RowGate
    from corps.engine.model.linear import Linear

    torch.manual_seed(0)
    base = Linear.of(torch.randn(5, 4), None, mixed=False)
    gate = RowGate()
    g = GatedLoRA(base, torch.randn(2, 4), torch.randn(5, 2), gate)
    x = torch.randn(3, 4)
    assert torch.equal(g(x), base(x)) and g.in_features == base.in_features
    gate.set(torch.tensor([1]), 3)
    y = g(x)
    assert torch.equal(y[[0, 2]], base(x)[[0, 2]])
    assert torch.allclose(y[1], base(x)[1] + (x[1] @ g.a.T) @ g.b.T, atol=1e-6)
    gate.set(torch.tensor([0, 1, 2]), 3)  # every row: the fused path, same numbers
    assert gate.every and torch.allclose(g(x), base(x) + (x @ g.a.T) @ g.b.T, atol=1e-6)
    assert copy.copy(g).plain is base


def test_a_gated_projection_with_a_merged_copy_uses_it_for_steps_of_adapted_rows_only():
    from corps.engine.model.adapter_rows import GatedLoRA, RowGate
    from corps.engine.model.linear import Linear

    torch.manual_seed(0)
    w, a, b = torch.randn(5, 4), torch.randn(2, 4), torch.randn(5, 2)
    base, merged = Linear.of(w, None, mixed=False), Linear.of(w + b @ a, None, mixed=False)
    gate = RowGate()
    g = GatedLoRA(base, a, b, gate, merged)
    x = torch.randn(3, 4)
    assert torch.equal(g(x), base(x))
    gate.set(torch.tensor([0, 2]), 3)  # some rows: base plus the product on them
    assert torch.equal(g(x)[1], base(x)[1])
    assert torch.allclose(g(x)[[0, 2]], merged(x)[[0, 2]], atol=1e-5)
    gate.set(torch.tensor([0, 1, 2]), 3)  # every row: the merged projection itself
    assert torch.equal(g(x), merged(x))
    ran = []
    counted = GatedLoRA(lambda x: ran.append(x) or base(x), a, b, gate, merged)
    assert torch.equal(counted(x), merged(x)) and not ran  # not the base's product too
    assert g.weight_bytes == base.weight_bytes + merged.weight_bytes + 4 * (8 + 10)
