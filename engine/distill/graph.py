"""A workflow's messages as a graph: what each one encoded, where, and what it attended to.

`Engine.graph(handles)` takes it from the messages a run made (and everything they
attended to). It holds token ids and positions only, no tensors, so it is saved
next to a trace (JSON) and recomputed later by the differentiable recompute
(`corps.engine.distill.differentiable`), which recomputes every encoding from the tokens
with whatever weights it is given.

A node is one message encoded in choreographed mode: its framed `tokens` start at
logical position `offset`; it attended to the attention sink (`MessageGraph.sink`,
at positions 0..len(sink)-1), then to each parent's tokens placed at the parent's
offset in `parent_offsets`, then causally to its own earlier tokens. A decode's
sampled tokens are `tokens[generated_from : generated_from + generated]`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path

from corps.cache.errors import InvalidRequest
from corps.cache.handle import Handle
from corps.cache.messages import MessageTable


@dataclass(frozen=True)
class Node:
    """One message of a workflow (see the module docstring)."""

    id: int
    kind: str  # "prefill" or "decode"
    role: str
    owner: str | None
    tokens: tuple[int, ...]
    offset: int
    parents: tuple[int, ...]
    parent_offsets: tuple[int, ...]
    generated_from: int = 0
    generated: int = 0

    @property
    def targets(self) -> tuple[int, ...]:
        """The tokens a decode sampled (its log-loss is on these); () for a prefill."""
        return self.tokens[self.generated_from : self.generated_from + self.generated]


@dataclass(frozen=True)
class MessageGraph:
    """A workflow's messages in the order they were made (parents before children)."""

    sink: tuple[int, ...]
    nodes: tuple[Node, ...]
    meta: dict = field(default_factory=dict)  # free-form: pattern, inputs, seed, ...

    def __post_init__(self) -> None:
        seen: set[int] = set()
        for n in self.nodes:
            missing = [p for p in n.parents if p not in seen]
            if missing:
                raise InvalidRequest(
                    f"message {n.id} attends to {missing}, which are not earlier in the graph"
                )
            if len(n.parents) != len(n.parent_offsets):
                raise InvalidRequest(f"message {n.id}: one offset per parent")
            seen.add(n.id)

    @cached_property
    def by_id(self) -> dict[int, Node]:
        return {n.id: n for n in self.nodes}

    @property
    def decodes(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.kind == "decode")

    @property
    def target_tokens(self) -> int:
        """How many decoded tokens the workflow's log-loss is over."""
        return sum(n.generated for n in self.nodes)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> MessageGraph:
        raw = json.loads(text)
        nodes = tuple(
            Node(
                **{
                    **n,
                    "tokens": tuple(n["tokens"]),
                    "parents": tuple(n["parents"]),
                    "parent_offsets": tuple(n["parent_offsets"]),
                }
            )
            for n in raw["nodes"]
        )
        return cls(sink=tuple(raw["sink"]), nodes=nodes, meta=raw.get("meta", {}))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> MessageGraph:
        return cls.from_json(Path(path).read_text())


def message_graph(
    table: MessageTable, handles: Iterable[Handle | None], sink: Sequence[int], meta: dict
) -> MessageGraph:
    """The messages `handles` name and everything they attended to, from the table's
    records, in the order they were made (`Engine.graph`)."""
    nodes: dict[int, Node] = {}
    todo = [h.id for h in handles if h is not None]
    while todo:
        msg = table.get(todo.pop())
        if msg.id in nodes or msg.kind == "sink":
            continue
        nodes[msg.id] = Node(
            msg.id, msg.kind, msg.role, msg.owner, tuple(msg.tokens), msg.offset,
            tuple(msg.parents), tuple(msg.parent_offsets), msg.generated_from, msg.generated,
        )  # fmt: skip
        todo += msg.parents
    ordered = tuple(nodes[i] for i in sorted(nodes))
    return MessageGraph(sink=tuple(sink), nodes=ordered, meta=dict(meta))
