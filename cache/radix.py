"""Token-level radix tree of cached prefixes (baseline mode), SGLang-style.

Each edge holds a run of tokens and the store slots of their K/V, encoded as a
causal prefix from position 0. A running call locks the path it reuses; only
unlocked leaves are evicted, least recently used first.

Nodes remember which call inserted them (`creator`), so a call that inserted
part of its prompt early (to share it with calls running beside it) and then
failed can take back exactly what it added and nobody uses (`drop`).

A `salt` keeps trees apart: prefixes cached under one salt are never matched
under another (vLLM's `cache_salt`), so tenants of one server cannot learn each
other's prompts from cache hits. None is the engine's own, unsalted tree.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

from corps.cache.errors import require


@dataclass(eq=False)
class Node:
    key: list[int] = field(default_factory=list)  # tokens on the edge into this node
    slots: list[int] = field(default_factory=list)  # one per token of key
    parent: Node | None = None
    children: dict[int, Node] = field(default_factory=dict)  # first token -> child
    lock: int = 0
    last_used: int = 0
    creator: int | None = None  # the call that inserted these tokens


@dataclass(frozen=True)
class Match:
    length: int  # tokens matched
    slots: list[int]  # their slots
    node: Node  # deepest node touched (lock this while using the slots)
    creators: tuple[tuple[int | None, int], ...] = ()  # (creator, tokens) along the path


class RadixCache:
    def __init__(self) -> None:
        self.roots: dict[str | None, Node] = {None: Node()}
        self._clock = itertools.count(1)
        self.size = 0  # tokens held
        self.hit_tokens = 0
        self.query_tokens = 0

    @property
    def root(self) -> Node:
        """The unsalted tree's root."""
        return self.roots[None]

    def _root(self, salt: str | None) -> Node:
        root = self.roots.get(salt)
        if root is None:
            root = self.roots[salt] = Node()
        return root

    def match(self, tokens: list[int], *, count: bool = True, salt: str | None = None) -> Match:
        """Longest cached prefix of tokens (under `salt`). Splits the last edge if the
        match ends inside it.

        `count=False` leaves the hit-rate counters alone (the engine's own lookups).
        """
        node, i, slots, creators = self._root(salt), 0, [], []
        now = next(self._clock)
        node.last_used = now
        while i < len(tokens) and tokens[i] in node.children:
            child = node.children[tokens[i]]
            n = _common(child.key, tokens, i)
            if n < len(child.key):
                child = self._split(child, n)
            slots.extend(child.slots)
            creators.append((child.creator, n))
            child.last_used = now
            node, i = child, i + n
        if count:
            self.query_tokens += len(tokens)
            self.hit_tokens += i
        return Match(i, slots, node, tuple(creators))

    def peek(self, tokens: list[int], salt: str | None = None) -> int:
        """Length of the longest cached prefix of tokens (under `salt`); changes nothing."""
        node, i = self.roots.get(salt), 0
        if node is None:
            return 0
        while i < len(tokens) and tokens[i] in node.children:
            child = node.children[tokens[i]]
            n = _common(child.key, tokens, i)
            i += n
            if n < len(child.key):
                break
            node = child
        return i

    def insert(
        self, tokens: list[int], slots: list[int], creator: int | None = None,
        salt: str | None = None,
    ) -> list[int]:  # fmt: skip
        """Cache tokens (under `salt`) with their slots; returns the slots that duplicate
        cached ones.

        The caller releases the returned slots to the store. New nodes are tagged
        with `creator`.
        """
        assert len(tokens) == len(slots)
        node, i, dup = self._root(salt), 0, []
        now = next(self._clock)
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                leaf = Node(list(tokens[i:]), list(slots[i:]), node, last_used=now, creator=creator)
                node.children[tokens[i]] = leaf
                self.size += len(leaf.key)
                return dup
            n = _common(child.key, tokens, i)
            if n < len(child.key):
                child = self._split(child, n)
            dup.extend(s for s, c in zip(slots[i : i + n], child.slots, strict=True) if s != c)
            child.last_used = now
            node, i = child, i + n
        return dup

    def lock(self, node: Node) -> None:
        while node is not None:
            node.lock += 1
            node = node.parent

    def unlock(self, node: Node) -> None:
        while node is not None:
            node.lock -= 1
            node = node.parent

    def evict(self, n_tokens: int) -> list[int]:
        """Drop least-recently-used unlocked leaves until n_tokens are freed; returns slots."""
        heap = [(n.last_used, id(n), n) for n in self._nodes() if self._is_free_leaf(n)]
        heapq.heapify(heap)
        freed: list[int] = []
        while heap and len(freed) < n_tokens:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            del parent.children[leaf.key[0]]
            freed.extend(leaf.slots)
            self.size -= len(leaf.key)
            if self._is_free_leaf(parent):
                heapq.heappush(heap, (parent.last_used, id(parent), parent))
        self._prune()
        return freed

    def drop(self, creator: int) -> list[int]:
        """Remove the unlocked leaves `creator` inserted, bottom up; returns their slots."""
        freed: list[int] = []
        leaves = [n for n in self._nodes() if n.creator == creator and self._is_free_leaf(n)]
        while leaves:
            leaf = leaves.pop()
            parent = leaf.parent
            del parent.children[leaf.key[0]]
            freed.extend(leaf.slots)
            self.size -= len(leaf.key)
            if parent.creator == creator and self._is_free_leaf(parent):
                leaves.append(parent)
        self._prune()
        return freed

    def _prune(self) -> None:
        """Forget the salted trees left empty (a server's tenants come and go)."""
        empty = [s for s, r in self.roots.items() if s is not None and not r.children]
        for salt in [s for s in empty if self.roots[s].lock == 0]:
            del self.roots[salt]

    def holds(self, creator: int) -> bool:
        """Whether any node `creator` inserted is still in the tree."""
        return any(n.creator == creator for n in self._nodes())

    def check_idle(self) -> list[int]:
        """BrokenInvariant unless no node is locked and `size` counts the nodes' tokens;
        returns the store slots the tree holds."""
        slots: list[int] = []
        for node in self._nodes():
            require(node.lock == 0, "a radix node is still locked while idle")
            slots += node.slots
        require(self.size == len(slots), "the radix tree's size is off")
        return slots

    def _is_free_leaf(self, node: Node) -> bool:
        return node.parent is not None and not node.children and node.lock == 0

    def _split(self, child: Node, n: int) -> Node:
        """Cut child's edge after n tokens; returns the new upper node."""
        upper = Node(
            child.key[:n],
            child.slots[:n],
            child.parent,
            lock=child.lock,
            last_used=child.last_used,
            creator=child.creator,
        )
        upper.children[child.key[n]] = child
        child.parent.children[child.key[0]] = upper
        child.key, child.slots, child.parent = child.key[n:], child.slots[n:], upper
        return upper

    def _nodes(self):
        stack = list(self.roots.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())


def _common(key: list[int], tokens: list[int], start: int) -> int:
    n = 0
    limit = min(len(key), len(tokens) - start)
    while n < limit and key[n] == tokens[start + n]:
        n += 1
    return n
