"""Distillation (patterns/evaluation/distill.py): traces, the loss, the adapter it saves."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from corps.agents import Runtime
from corps.engine.distill.differentiable import DifferentiableReplay
from corps.engine.exec.torch_thread import TORCH
from corps.engine.model.adapter_files import read_scope, trainable
from corps.patterns.evaluation import distill

from conftest import open_tiny
from helpers import hf_model

CHAIN = dict(questions=["what is two plus two"], answers=None, max_tokens=6, constrained=False)
BLOCKED = dict(questions=["what is two plus two", "name a colour"], answers=None,
               layout="parallel", max_tokens=6, constrained=False)  # fmt: skip


async def _traces(tiny_dirs, lines, path, seeds=None):
    async with (
        open_tiny(tiny_dirs, "llama", mode="baseline") as b,
        open_tiny(tiny_dirs, "llama") as c,
        Runtime(b) as rb,
        Runtime(c) as rc,
    ):
        seeds = seeds or list(range(len(lines)))
        return await distill.collect(rb, rc, "multi_qa", lines, seeds, path)


async def test_on_a_chain_the_loss_and_lora_gradients_are_transformers_and_peft(
    tiny_dirs, tmp_path
):
    """Where choreography equals the baseline (a chain), the replay's loss and the
    LoRA gradients are those of peft on the rendered conversation."""
    (trace,), _ = await _traces(tiny_dirs, [CHAIN], tmp_path / "t.jsonl")
    torch.manual_seed(0)
    model = trainable(hf_model(tiny_dirs["llama"]), rank=4, alpha=8, dropout=0.0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    lora = {n: p for n, p in model.named_parameters() if p.requires_grad}

    loss = DifferentiableReplay(model).run(trace.graph).loss()
    got = torch.autograd.grad(loss, list(lora.values()))

    ids = list(trace.graph.sink) + [t for n in trace.graph.nodes for t in n.tokens]
    (answer,) = trace.graph.decodes
    start = len(ids) - len(answer.tokens) + answer.generated_from  # first sampled token
    logits = model(input_ids=torch.tensor([ids])).logits[0]  # (T, V)
    logp = torch.log_softmax(logits[start - 1 : start - 1 + answer.generated], -1)
    want_loss = -logp.gather(1, torch.tensor(answer.targets)[:, None]).sum()
    want = torch.autograd.grad(want_loss, list(lora.values()))

    assert loss.item() == pytest.approx(want_loss.item(), rel=1e-4)
    for name, g, w in zip(lora, got, want, strict=True):
        assert torch.allclose(g, w, rtol=1e-4, atol=1e-6 * float(w.abs().max())), name
    with torch.no_grad(), model.disable_adapter():  # the baseline scored them unadapted
        plain = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0], -1)
    rows = plain[start - 1 : start - 1 + answer.generated]
    scored = rows.gather(1, torch.tensor(answer.targets)[:, None])[:, 0].tolist()
    assert list(trace.baseline[answer.id].logprobs) == pytest.approx(scored, abs=1e-4)
    assert len(trace.baseline[answer.id].logprobs) == answer.generated


async def test_traces_are_appended_and_a_second_collect_resumes(tiny_dirs, tmp_path):
    path = tmp_path / "t.jsonl"
    first, failed = await _traces(tiny_dirs, [BLOCKED] * 2, path)
    assert not failed and [t.index for t in first] == [0, 1]
    path.write_text(path.read_text() + '{"index": 2, "torn')  # an interrupted write
    again, _ = await _traces(tiny_dirs, [BLOCKED] * 3, path)
    assert [t.index for t in again] == [0, 1, 2]
    assert again[:2] == first  # loaded, not sampled again
    assert len([x for x in path.read_text().splitlines() if x.endswith("}")]) == 3
    other_seeds, _ = await _traces(tiny_dirs, [BLOCKED] * 3, path, seeds=[0, 1, 9])
    assert other_seeds[2].seed == 9  # a changed seed samples that input again


async def test_a_seeded_distillation_lowers_the_held_out_gap_and_peft_loads_it(tiny_dirs, tmp_path):
    traces, _ = await _traces(tiny_dirs, [BLOCKED] * 12, tmp_path / "t.jsonl")
    out = tmp_path / "adapter"
    settings = distill.Settings(epochs=3, rank=4, alpha=8, dropout=0.0, lr=3e-3, batch=2)
    steps, epochs = [], []
    report = distill.distill(
        tiny_dirs["llama"], traces[:8], traces[8:], out, settings,
        on_step=lambda *a: steps.append((*a, threading.get_ident() == TORCH.ident)),
        on_epoch=epochs.append,
    )  # fmt: skip
    assert [e.epoch for e in epochs] == [0, 1, 2, 3]
    assert len(steps) == 12 and steps[-1][:2] == (12, 12)
    assert all(s[-1] for s in steps)  # trained on the torch thread (one OpenMP team)
    assert report.before > 0 and report.after < report.before
    assert [e.epoch for e in report.epochs] == [0, 1, 2, 3]
    # the training gap: the first 4 training traces (as many as validation ones),
    # scored by the untrained model at epoch 0, and fitted by training
    from corps.engine.distill.differentiable import DifferentiableReplay
    from corps.engine.model.weights import load_hf

    untrained = DifferentiableReplay(load_hf(tiny_dirs["llama"], dtype=torch.float32))
    want = distill.gap_table(untrained, traces[:4])[-1].gap
    assert report.epochs[0].train_gap == pytest.approx(want, abs=1e-6)
    assert report.epochs[-1].train_gap < report.epochs[0].train_gap
    saved = json.loads((out / "distill.json").read_text())
    assert saved["epochs"][0]["train_gap"] == report.epochs[0].train_gap
    assert saved["best_epoch"] == report.best_epoch > 0
    assert 0 < report.trainable_params < report.total_params

    from peft import PeftModel

    peft_model = PeftModel.from_pretrained(hf_model(tiny_dirs["llama"]), str(out)).eval()
    async with open_tiny(tiny_dirs, "llama", adapter=out) as engine:
        q = await engine.prefill("what is two plus two")
        h = await engine.decode(parents=[q], force=[7, 8, 9], logprobs=True)
        ids = engine.chat.sink + q.tokens + h.tokens[: h.generated_from + 3]
    with torch.no_grad():
        rows = torch.log_softmax(peft_model(torch.tensor([ids])).logits[0].double(), -1)[-4:-1]
    want = [float(r[t]) for r, t in zip(rows, [7, 8, 9], strict=True)]
    assert list(h.logprobs) == pytest.approx(want, abs=1e-4)


async def test_an_adapter_of_scope_rewired_leaves_chain_calls_alone(tiny_dirs, tmp_path):
    traces, _ = await _traces(tiny_dirs, [BLOCKED] * 8 + [CHAIN], tmp_path / "t.jsonl")
    out = tmp_path / "adapter"
    settings = distill.Settings(
        epochs=2, rank=4, alpha=8, dropout=0.0, lr=3e-3, batch=2, scope="rewired"
    )
    report = distill.distill(tiny_dirs["llama"], traces[:6], traces[6:8], out, settings)
    assert report.after < report.before  # the rewired calls' gap is what it trains on
    assert read_scope(out) == "rewired"
    chain = traces[8].graph
    from peft import PeftModel

    from corps.engine.model.weights import load_hf

    adapted = PeftModel.from_pretrained(hf_model(tiny_dirs["llama"]), str(out)).eval()
    plain = load_hf(tiny_dirs["llama"], dtype=torch.float32)
    with torch.no_grad():
        got = DifferentiableReplay(adapted, scope="rewired").run(chain).logprobs
        want = DifferentiableReplay(plain).run(chain).logprobs
        everywhere = DifferentiableReplay(adapted).run(chain).logprobs  # peft's own way
    for k in want:
        assert torch.equal(got[k], want[k])
        assert (everywhere[k] - want[k]).abs().max() > 1e-4
    with pytest.raises(ValueError, match="scope must be one of all, rewired"):
        distill.Settings(scope="some")


def test_distilling_nothing_is_refused(tiny_dirs, tmp_path):
    with pytest.raises(ValueError, match="no training traces"):
        distill.distill(tiny_dirs["llama"], [], [], tmp_path / "a")


async def test_on_a_chain_the_soft_loss_is_the_baselines_entropy(tiny_dirs, tmp_path):
    """Where choreography reads what the baseline reads, the replay's distribution is
    the teacher's: their cross-entropy is the teacher's entropy (Gibbs, with equality)."""
    (trace,), _ = await _traces(tiny_dirs, [CHAIN], tmp_path / "t.jsonl")
    replay = DifferentiableReplay(hf_model(tiny_dirs["llama"]))
    with torch.no_grad():
        out = replay.run(trace.graph, teacher=True)
        (answer,) = trace.graph.decodes
        rows = replay.baseline_logprobs(trace.graph, answer)
    assert out.soft_loss().item() == pytest.approx(-(rows.exp() * rows).sum().item(), rel=1e-4)


def test_targets_name_sets_or_modules():
    assert distill.targets_of("attention") == ("q_proj", "k_proj", "v_proj", "o_proj")
    assert distill.targets_of("mlp, q_proj,mlp") == ("gate_proj", "up_proj", "down_proj", "q_proj")
    assert distill.targets_of("all") == distill.Settings().targets
    for bad in ("attn", ""):
        with pytest.raises(ValueError, match="targets must be some of"):
            distill.Settings(targets=distill.targets_of(bad))


def test_an_unknown_objective_is_refused():
    with pytest.raises(ValueError, match="objective must be one of distribution, tokens"):
        distill.Settings(objective="kl")


def test_learning_rate_schedules_by_hand():
    assert [distill.lr_factor("constant", i, 4) for i in range(4)] == [1.0] * 4
    assert [distill.lr_factor("linear", i, 4) for i in range(4)] == [1.0, 0.75, 0.5, 0.25]
    cos = [distill.lr_factor("cosine", i, 4) for i in range(4)]
    assert cos == pytest.approx([1.0, 0.5 + 0.5 * 2**-0.5, 0.5, 0.5 - 0.5 * 2**-0.5])
    with pytest.raises(ValueError, match="schedule must be one of constant, linear, cosine"):
        distill.Settings(schedule="step")
