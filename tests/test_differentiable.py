"""The differentiable replay (corps.engine.distill.differentiable) against the engine itself."""

from __future__ import annotations

import pytest
import torch

from corps.engine.distill.differentiable import DifferentiableReplay
from corps.engine.distill.graph import MessageGraph

from conftest import open_tiny
from helpers import choreographed_workflow


@pytest.mark.parametrize("arch", ["llama", "llama-sink", "qwen3", "qwen2"])
async def test_the_replay_gives_the_engines_log_probabilities(tiny_dirs, tiny_hf, arch):
    async with open_tiny(tiny_dirs, arch) as engine:
        handles = await choreographed_workflow(engine)
        graph = engine.graph(handles[-1:], pattern="test")  # its ancestors come with it
    assert [n.id for n in graph.nodes] == [h.id for h in handles]
    assert graph.meta == {"pattern": "test"} and graph.sink == tuple(engine.chat.sink)
    out = DifferentiableReplay(tiny_hf[arch]).run(graph)
    for h in handles[3:]:
        assert out.logprobs[h.id].tolist() == pytest.approx(list(h.logprobs), abs=1e-4)
        assert out.greedy[h.id].tolist() == list(h.greedy)
    assert set(out.logprobs) == {h.id for h in handles[3:]}


async def test_gradients_flow_through_every_parent_encoding(tiny_dirs, tiny_hf):
    """The loss of the last decode alone reaches the weights through its parents:
    zeroing the parents' contribution (no context) changes the gradient."""
    async with open_tiny(tiny_dirs, "llama") as engine:
        handles = await choreographed_workflow(engine)
        graph = engine.graph(handles)
    hf = tiny_hf["llama"]
    embed = hf.model.embed_tokens.weight
    hf.zero_grad()
    DifferentiableReplay(hf).run(graph).loss().backward()
    grad = embed.grad.clone()
    hf.zero_grad()
    # the system prompt's tokens get gradient only through the children reading it
    system_tokens = set(graph.nodes[0].tokens) - {t for n in graph.nodes[1:] for t in n.tokens}
    assert system_tokens
    assert all(grad[t].abs().sum() > 0 for t in system_tokens)


def test_a_graph_round_trips_through_json_and_checks_its_order():
    graph = MessageGraph.from_json(
        '{"sink": [1], "nodes": [{"id": 3, "kind": "prefill", "role": "user", "owner": null,'
        ' "tokens": [5, 6], "offset": 1, "parents": [], "parent_offsets": []}], "meta": {}}'
    )
    assert MessageGraph.from_json(graph.to_json()) == graph
    from corps.engine.distill.graph import Node

    with pytest.raises(ValueError, match="not earlier in the graph"):
        MessageGraph(sink=(), nodes=(Node(4, "decode", "a", None, (1,), 0, (9,), (0,)),))


async def test_a_baseline_engine_has_no_graph(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama", mode="baseline") as engine:
        h = await engine.prefill("hi")
        with pytest.raises(ValueError, match="choreographed"):
            engine.graph([h])


async def test_the_teacher_is_the_baseline_engines_distribution(tiny_dirs, tiny_hf):
    """`teacher=True` scores each decode against the baseline's next-token
    distribution: at the sampled tokens it is what a baseline engine computes."""
    async with open_tiny(tiny_dirs, "llama-sink") as engine:
        handles = await choreographed_workflow(engine)
        graph = engine.graph(handles)
    async with open_tiny(tiny_dirs, "llama-sink", mode="baseline") as engine:
        system, q1, _q2 = [await engine.prefill(t, role=r) for t, r in (
            ("you are a helpful assistant", "system"), ("what is two plus two", "user"),
            ("name a colour", "user"))]  # fmt: skip
        a1 = await engine.decode(parents=[system, q1], force=handles[3].generated, logprobs=True)
    replay = DifferentiableReplay(tiny_hf["llama-sink"])
    node = next(n for n in graph.nodes if n.id == handles[3].id)
    rows = replay.baseline_logprobs(graph, node)  # (n, V)
    got = rows.gather(1, torch.tensor(node.targets)[:, None])[:, 0].tolist()
    assert got == pytest.approx(list(a1.logprobs), abs=1e-4)
    out = replay.run(graph, teacher=True)
    assert set(out.soft) == set(out.logprobs)
    entropy = -(rows.exp() * rows).sum()  # Gibbs: cross-entropy >= entropy, = on a chain
    assert out.soft[node.id].item() >= entropy.item() - 1e-4
    for n in graph.decodes:
        assert out.soft[n.id].ndim == 0
    assert out.soft_loss().item() == pytest.approx(sum(v.item() for v in out.soft.values()))
