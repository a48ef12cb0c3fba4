"""The message table (corps.cache.messages): handle counting and forgetting records."""

from __future__ import annotations

import gc

import pytest

from corps.cache import Handle
from corps.cache.errors import UnknownHandle
from corps.cache.messages import Message, MessageTable


def add(table: MessageTable, sources=(), freed=False) -> int:
    mid = table.next_id()
    table.add(
        Message(
            mid,
            [1],
            "t",
            "user",
            "prefill",
            [],
            0,
            tuple(sources),
            (0,) * len(sources),
            sources=frozenset(sources),
            freed=freed,
        )
    )
    return mid


def test_handles_count_themselves_and_report_when_the_last_one_dies():
    table = MessageTable()
    mid = add(table)
    h = Handle(mid, table)
    h2 = Handle(mid, table, "bob")
    assert table.referenced(mid)
    del h
    gc.collect()
    assert table.referenced(mid) and not table.unreferenced
    del h2
    gc.collect()
    assert not table.referenced(mid) and list(table.unreferenced) == [mid]


def test_copies_are_the_same_object():
    import copy

    table = MessageTable()
    h = Handle(add(table), table)
    assert copy.copy(h) is h and copy.deepcopy(h) is h


def test_only_freed_unpinned_unreferenced_records_without_dependents_are_forgotten():
    table = MessageTable()
    parent = add(table)
    child = add(table, sources=[parent])
    assert table.forget(parent) == []  # not freed
    table.get(parent).freed = True
    assert table.forget(parent) == []  # the child's encoding attended to it
    h = Handle(child, table)
    table.get(child).freed = True
    assert table.forget(child) == []  # a handle still names it
    del h
    gc.collect()
    table.get(child).pins = 1
    assert table.forget(child) == []  # a call reads it
    table.get(child).pins = 0
    assert table.forget(child) == [parent]  # the parent lost its last dependent
    assert table.forget(parent) == []  # returns what it orphaned: nothing
    assert table.records == 0 and table.forgotten == 2
    with pytest.raises(UnknownHandle, match="forgotten"):
        table.get(parent)
