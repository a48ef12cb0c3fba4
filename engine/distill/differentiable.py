"""The differentiable recompute: a workflow's choreographed encodings recomputed with autograd.

Distillation (the Prompt Choreography paper, section 3.4) trains the model so that
the choreographed workflow, forced to produce a baseline run's tokens, gives them
a lower log-loss. That needs the whole workflow in one autograd graph: every
parent's encoding is computed by the model being trained, inside the same graph,
and then read by its children.

`DifferentiableReplay(model).run(graph)` does that over a `MessageGraph`
(`Engine.graph`) with a transformers causal LM (a `peft` LoRA model, or a plain
one): each message is encoded by the model with a `DynamicCache` holding exactly
its context (the attention sink, then each parent's keys and values), the
parents' keys moved from where they were encoded to where the message placed
them by a rotation (RoPE: repositioning is a rotation of the key by the angle of
the position difference; values never change). The rotation is a new tensor, so
the parent's own encoding is untouched for its other readers (non-destructive),
and gradients flow back through it into the parent's encoding. Sibling messages
never read each other, whether the engine ran them in one step or not, so
encoding them one after the other gives what the engine computed in parallel.

The result is each decode's log-probabilities of its sampled tokens, equal to the
engine's `logprobs=True` in float32 (tests check <= 1e-4). With `scope="rewired"`
a peft model's adapter is on only for the messages whose context choreography
rewired (`corps.cache.rewired`), as the engine serves such an adapter.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from torch import Tensor

from corps.cache.rewired import rewired
from corps.cache.rope import rotate_half
from corps.engine.distill.graph import MessageGraph, Node
from corps.engine.model.adapter_files import SCOPES


@dataclass
class Encoding:
    """One message's keys and values per layer, as encoded at `offset`."""

    keys: list[Tensor]  # per layer (1, H_kv, T, D), rotated for positions offset..
    values: list[Tensor]  # per layer (1, H_kv, T, D)
    offset: int


@dataclass
class ReplayOutput:
    """Per decode node id: the log-probability of each sampled token (n,) and the
    greedy token at each of those positions (n,)."""

    logprobs: dict[int, Tensor]
    greedy: dict[int, Tensor]
    # with `teacher=True`: per decode, the cross-entropy (summed over its positions) from
    # the baseline's whole next-token distribution at each position to the recompute's
    soft: dict[int, Tensor] = field(default_factory=dict)

    def loss(self) -> Tensor:
        """The workflow's total log-loss over its decoded tokens (a scalar)."""
        return -torch.cat(list(self.logprobs.values())).sum()

    def soft_loss(self) -> Tensor:
        """The total cross-entropy to the baseline's distributions (`teacher=True`)."""
        return torch.stack(list(self.soft.values())).sum()


class DifferentiableReplay:
    """Recomputes a workflow's encodings with `model`, differentiably (see module)."""

    def __init__(self, model, *, scope: str = "all") -> None:
        """`scope`: which calls a peft model's adapter applies to: "all", or "rewired"
        (only calls whose context choreography rewired, `corps.cache.rewired`; the
        others run the base model, as the engine serves such an adapter)."""
        if scope not in SCOPES:
            raise ValueError(f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.model = model
        self.scope = scope
        self.inv_freq = base.model.rotary_emb.inv_freq  # (D/2,)
        self.device = base.model.embed_tokens.weight.device

    def run(self, graph: MessageGraph, *, teacher: bool = False) -> ReplayOutput:
        """Encode every node in order; each decode's log-probs of its sampled tokens.

        `teacher`: also the cross-entropy from the baseline's next-token distribution
        at each of a decode's positions (`baseline_logprobs`, without gradient) to the
        recompute's: the same target as the sampled tokens' log-loss in expectation, with
        far less variance (distillation's `objective="distribution"`)."""
        sink = None
        if graph.sink:  # the sink reads nothing: a chain, so the base model's under "rewired"
            with self._base() if self.scope == "rewired" else nullcontext():
                sink = self._encode(list(graph.sink), [], 0, None)[1]
        enc: dict[int, Encoding] = {}
        out = ReplayOutput({}, {})
        for node in graph.nodes:
            ctx = [(sink, 0)] if sink is not None else []
            ctx += [
                (enc[p], start) for p, start in zip(node.parents, node.parent_offsets, strict=True)
            ]
            with self._adapted(graph, node):
                logits, enc[node.id] = self._encode(list(node.tokens), ctx, node.offset, node)
            if node.generated:
                targets = torch.tensor(node.targets, device=self.device)  # (n,)
                logp = torch.log_softmax(logits.float(), dim=-1)  # (n, V)
                out.logprobs[node.id] = logp.gather(1, targets[:, None])[:, 0]
                out.greedy[node.id] = logp.detach().argmax(-1)
                if teacher:
                    p = self.baseline_logprobs(graph, node).exp()  # (n, V)
                    out.soft[node.id] = -(p * logp).sum()
        return out

    def _adapted(self, graph: MessageGraph, node: Node):
        """A context in which `node` is encoded: the adapter off for a chain call
        under scope "rewired", else as it is."""
        if self.scope == "all":
            return nullcontext()
        lookup = graph.by_id.__getitem__
        if rewired(node.offset, node.parents, node.parent_offsets, lookup, len(graph.sink)):
            return nullcontext()
        return self._base()

    def _base(self):
        """The adapter off (a plain model has none)."""
        off = getattr(self.model, "disable_adapter", None)
        return off() if off is not None else nullcontext()

    def baseline_logprobs(self, graph: MessageGraph, node: Node) -> Tensor:
        """The baseline's log-softmax rows (n, V) at a decode's sampled positions: the
        base model (a peft model's adapter off) over the rendered prompt, the sink then
        the parents' tokens in order then the node's own, as baseline mode encodes it."""
        prompt = list(graph.sink) + [t for p in node.parents for t in graph.by_id[p].tokens]
        ids = prompt + list(node.tokens)
        start = len(prompt) + node.generated_from - 1
        rows = torch.arange(start, start + node.generated, device=self.device)
        with torch.no_grad(), self._base():
            logits = self.model(
                input_ids=torch.tensor([ids], device=self.device), logits_to_keep=rows
            ).logits[0]
        return torch.log_softmax(logits.float(), dim=-1)

    def _encode(
        self, tokens: list[int], ctx: list[tuple[Encoding, int]], offset: int, node: Node | None
    ) -> tuple[Tensor, Encoding]:
        """Encode `tokens` at `offset` over the context [(encoding, placed at)]; its
        logits at the rows that predict a decode's sampled tokens, and its encoding."""
        from transformers import DynamicCache

        cache, n = DynamicCache(), sum(e.keys[0].shape[2] for e, _ in ctx)
        if ctx:
            for layer in range(len(ctx[0][0].keys)):
                keys = [self._moved(e.keys[layer], start - e.offset) for e, start in ctx]
                values = [e.values[layer] for e, _ in ctx]
                cache.update(torch.cat(keys, 2), torch.cat(values, 2), layer)
        t = len(tokens)
        rows = (
            torch.arange(node.generated_from - 1, node.generated_from + node.generated - 1)
            if node is not None and node.generated
            else 1  # a prefill: no logits needed, one row is the cheapest
        )
        out = self.model(
            input_ids=torch.tensor([tokens], device=self.device),
            position_ids=torch.arange(offset, offset + t, device=self.device)[None],
            cache_position=torch.arange(n, n + t, device=self.device),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=rows,
        )
        layers = out.past_key_values.layers
        keys = [layer.keys[:, :, n:] for layer in layers]  # (1, H_kv, t, D) each
        values = [layer.values[:, :, n:] for layer in layers]
        return out.logits[0], Encoding(keys, values, offset)

    def _moved(self, keys: Tensor, delta: int) -> Tensor:
        """Keys (1, H, T, D) rotated by `delta` positions (a new tensor)."""
        if delta == 0:
            return keys
        angle = delta * torch.cat([self.inv_freq, self.inv_freq]).to(torch.float32)  # (D,)
        k = keys.float()
        moved = k * torch.cos(angle) + rotate_half(k) * torch.sin(angle)
        return moved.to(keys.dtype)
