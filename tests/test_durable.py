"""The store directory on its own: identity is checked, files and
rows stay consistent, and hostile directories are refused with a typed error."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sqlite3
import time

import numpy as np
import pytest
import torch
from hypothesis import strategies as st

from corps.cache.durable import DB, KV, DurableStore, StoreError, StoreMismatch
from corps.cache.messages import Message, MessageTable

ID = {"model": "abc", "dtype": "float32", "mode": "choreographed"}

ints = st.lists(st.integers(0, 50_000), max_size=8)


def test_a_new_store_keeps_its_identity_and_refuses_another(tmp_path):
    DurableStore.open(tmp_path / "s", ID).close()
    DurableStore.open(tmp_path / "s", ID).close()  # the same: fine
    with pytest.raises(StoreMismatch, match=r"dtype: 'float32' there, 'bfloat16' here"):
        DurableStore.open(tmp_path / "s", {**ID, "dtype": "bfloat16"})
    with pytest.raises(StoreMismatch, match=r"weights: None there, 'gguf' here"):
        DurableStore.open(tmp_path / "s", {**ID, "weights": "gguf"})


def test_hostile_directories_are_typed_errors(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(StoreError, match="is a file"):
        DurableStore.open(tmp_path / "file", ID)
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / DB).write_bytes(b"\x00\xffnot sqlite" * 100)
    with pytest.raises(StoreError, match="cannot be opened"):
        DurableStore.open(junk, ID)
    other = tmp_path / "other"
    DurableStore.open(other, ID).close()
    with sqlite3.connect(other / DB) as db:
        db.execute("UPDATE meta SET value = '99' WHERE key = 'format'")
    with pytest.raises(StoreError, match="format '99'"):
        DurableStore.open(other, ID)


def test_a_damaged_record_is_a_typed_error_naming_the_message(tmp_path):
    store = DurableStore.open(tmp_path, ID)
    store.added(Message(5, [1, 2], "hi", "user", "prefill", [], 0, (), ()))
    store.close()
    with sqlite3.connect(tmp_path / DB) as db:
        db.execute("UPDATE messages SET record = '{\"id\": 5' WHERE id = 5")
    with pytest.raises(StoreError, match="message 5's record is damaged"):
        DurableStore.open(tmp_path, ID).messages()


def kv(n: int) -> torch.Tensor:
    return torch.randn(2, n, 3, 4)  # (L, n, H, D)


def test_the_table_journals_what_it_makes_frees_and_forgets(tmp_path):
    store = DurableStore.open(tmp_path, ID)
    table = MessageTable()
    table.journal = store
    a = Message(table.next_id(), [1, 2, 3], "a", "user", "prefill", [], 0, (), ())
    sink = Message(table.next_id(), [9], "", "system", "sink", [], 0, (), ())
    table.add(a)
    table.add(sink)
    assert [s.message.id for s in store.messages()] == [a.id]  # the sink never
    store.save(a, kv(3), kv(3))
    assert (tmp_path / KV / f"{a.id}.safetensors").is_file()
    a.freed = True
    table.freed(a)
    assert not (tmp_path / KV / f"{a.id}.safetensors").exists()  # freed: its encoding goes
    assert store.messages()[0].message.freed  # its record stays while others may need it
    table.forget(a.id)
    assert store.messages() == []


def test_saved_encodings_read_back_and_damaged_ones_are_none(tmp_path):
    store = DurableStore.open(tmp_path, ID)
    m = Message(1, [1, 2], "x", "user", "prefill", [0, 1], 0, (), ())
    store.added(m)
    k, v = kv(2), kv(2)
    store.save(m, k, v)
    (stored,) = store.messages()
    got = store.load_kv(stored.kv)
    assert torch.equal(got[0], k) and torch.equal(got[1], v)
    stored.kv.write_bytes(b"garbage")
    assert store.load_kv(stored.kv) is None


def test_files_no_row_names_are_swept_when_the_store_opens(tmp_path):
    """A crash after an encoding's rename but before its row: the file is garbage."""
    store = DurableStore.open(tmp_path, ID)
    m = Message(1, [1, 2], "x", "user", "prefill", [], 0, (), ())
    store.added(m)
    store.save(m, kv(2), kv(2))
    store.close()
    (tmp_path / KV / "7.safetensors").write_bytes(b"orphan")
    (tmp_path / KV / "8.tmp").write_bytes(b"half written")
    DurableStore.open(tmp_path, ID).close()
    assert sorted(f.name for f in (tmp_path / KV).iterdir()) == ["1.safetensors"]


def test_a_write_the_disk_refuses_fails_no_call(tmp_path):
    store = DurableStore.open(tmp_path, ID)
    store._db.close()  # every statement now raises sqlite3.ProgrammingError (an Error)
    with pytest.warns(RuntimeWarning, match="refused a write"):
        store.added(Message(1, [1], "x", "user", "prefill", [], 0, (), ()))
    store.added(Message(2, [1], "x", "user", "prefill", [], 0, (), ()))
    assert store.failures == 2


def test_restored_records_keep_their_ids_and_new_ids_follow(tmp_path):
    table = MessageTable()
    first = table.next_id()
    old = [Message(i, [1], "x", "user", "prefill", [], 0, (), ()) for i in (3, 8)]
    table.restore(old)
    assert table.get(8) is old[1] and table.next_id() == 9 and first == 0


def test_a_store_serves_one_engine_at_a_time(tmp_path):
    """Two engines on one store would hand out the same ids: the second is refused
    until the first closes (a killed process lets go of it: the lock is the kernel's)."""
    first = DurableStore.open(tmp_path, ID)
    with pytest.raises(StoreError, match="open in another engine"):
        DurableStore.open(tmp_path, ID)
    first.close()
    DurableStore.open(tmp_path, ID).close()


def test_a_row_naming_a_path_is_not_followed(tmp_path):
    """An encoding's file is named by its row; a row that names anything but a file
    of the store's own (a path, another name) is taken as no encoding."""
    store = DurableStore.open(tmp_path, ID)
    m = Message(1, [1, 2], "x", "user", "prefill", [], 0, (), ())
    store.added(m)
    store._db.execute("UPDATE messages SET kv = '../../etc/passwd' WHERE id = 1")
    assert store.messages()[0].kv is None and store.take(m) is None


def _writer(root: str, start: int) -> None:
    """A child process writing messages and encodings, freeing and forgetting some,
    until it is killed."""
    store = DurableStore.open(root, ID)
    table = MessageTable()
    table.restore([s.message for s in store.messages()])
    table.journal = store
    rng = np.random.default_rng(start)
    for _ in range(10_000):
        m = Message(table.next_id(), [1] * 4, "x" * 50, "user", "prefill", [], 0, (), ())
        table.add(m)
        if rng.random() < 0.7:
            store.save(m, torch.randn(2, 4, 3, 8), torch.randn(2, 4, 3, 8))
        if rng.random() < 0.2:
            m.freed = True
            table.freed(m)
            table.forget(m.id)


def test_a_store_killed_at_random_points_reopens_whole(tmp_path):
    """Writers killed (SIGKILL) at random instants on one store (25 here; CORPS_KILLS=100
    for the issue's count): it reopens every time, every row reads back, every encoding
    a row names loads and checks out."""
    ctx = mp.get_context("fork")
    rng = np.random.default_rng(0)
    for i in range(int(os.environ.get("CORPS_KILLS", "25"))):
        child = ctx.Process(target=_writer, args=(str(tmp_path), i), daemon=True)
        child.start()
        time.sleep(float(rng.uniform(0.02, 0.3)))  # a kill point: not a synchronisation
        os.kill(child.pid, signal.SIGKILL)
        child.join()
        store = DurableStore.open(tmp_path, ID)
        stored = store.messages()
        for s in stored:
            if s.kv is not None:
                assert store.take(s.message) is not None, f"kill {i}: message {s.message.id}"
        assert len({s.message.id for s in stored}) == len(stored)
        store.close()
    assert stored  # the writers got somewhere


def test_an_encoding_whose_bytes_changed_reads_back_as_none(tmp_path):
    """A file of the right size whose data a crash zeroed: the checksum refuses it."""
    store = DurableStore.open(tmp_path, ID)
    m = Message(1, [1, 2], "x", "user", "prefill", [], 0, (), ())
    store.added(m)
    store.save(m, kv(2), kv(2))
    path = tmp_path / KV / "1.safetensors"
    data = bytearray(path.read_bytes())
    data[-64:] = bytes(64)
    path.write_bytes(bytes(data))
    assert store.take(m) is None


def test_a_database_missing_its_tables_or_unwritable_is_a_typed_error(tmp_path):
    """A database of another program (a `meta` table of other columns), and a
    directory this process may not write: StoreError, nothing overwritten."""
    other = tmp_path / "other"
    other.mkdir()
    with sqlite3.connect(other / DB) as db:
        db.execute("CREATE TABLE meta (x INTEGER)")
    before = (other / DB).read_bytes()
    with pytest.raises(StoreError):
        DurableStore.open(other, ID)
    assert (other / DB).read_bytes() == before
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):  # root writes anywhere: nothing to refuse here
            pytest.skip("this process may write a read-only directory (root)")
        with pytest.raises(StoreError, match="cannot be opened"):
            DurableStore.open(locked / "s", ID)
    finally:
        locked.chmod(0o700)


def test_a_store_a_crash_left_before_its_identity_opens(tmp_path):
    """Killed between creating its tables and writing its identity: empty, still ours."""
    DurableStore.open(tmp_path, ID).close()
    with sqlite3.connect(tmp_path / DB) as db:
        db.execute("DELETE FROM meta")
    DurableStore.open(tmp_path, ID).close()


def test_check_finds_a_store_out_of_step_with_its_table(tmp_path):
    from corps.cache.errors import BrokenInvariant

    store = DurableStore.open(tmp_path, ID)
    m = Message(1, [1, 2], "x", "user", "prefill", [], 0, (), ())
    store.save(m, kv(2), kv(2))
    store.check({1})
    with pytest.raises(BrokenInvariant, match="differ"):
        store.check({1, 2})
    (tmp_path / KV / "1.safetensors").unlink()
    with pytest.raises(BrokenInvariant, match=r"no 1\.safetensors"):
        store.check({1})
