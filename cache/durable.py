"""Messages that outlive the process: the message table in SQLite, encodings in files.

A store is a directory: `messages.db`, an SQLite database in WAL mode holding one row
per message (its record as JSON: tokens, text, role, owner, visibility, parents and
where they sat, the steps it was encoded in) and the identity of the model that made
it (`meta`); and `kv/`, one safetensors file per encoding saved (K, unrotated, and V
of every layer, `(L, n, H, D)`).

Crash consistency: a row is written in one transaction as its message is made (a
process killed at any instant leaves every message made before it, and no half
row); an encoding's file is written under a temporary name and renamed before a
row names it, and carries a checksum of its tensors, so a file cut or zeroed by a
crash of the machine reads back as no encoding, never a wrong one; files no row
names (a crash between the rename and the row) are deleted when the store opens. A
message whose encoding was not saved comes back without one and is encoded again
from its tokens, over its parents at their offsets, when a call first reads it.

The store knows nothing of models: `open` compares the identity it is given (a
JSON object) with the one stored and raises `StoreMismatch` naming what differs.

A message's row is its record as JSON (`corps.cache.store_rows`).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import sqlite3
import threading
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from corps.cache.errors import StoreError, StoreMismatch, require
from corps.cache.messages import Message
from corps.cache.store_rows import decode, encode

__all__ = ["DB", "KV", "DurableStore", "StoreError", "StoreMismatch", "Stored"]

FORMAT = 1  # the layout of rows and files; a store of another format is refused
DB, KV = "messages.db", "kv"
#: identity keys a store may be rebuilt across (`open(rebuild=True)`): how the model
#: runs, not which model it is, so its messages' tokens are still right
REBUILDABLE = {"dtype", "weights", "kv"}


@dataclass(frozen=True)
class Stored:
    """One message as read back: its record (no slots yet) and its encoding's file."""

    message: Message
    kv: Path | None  # the saved encoding, None if none was saved


class DurableStore:
    """One store directory, open for one engine (see the module doc)."""

    def __init__(self, root: Path, db: sqlite3.Connection) -> None:
        self.root, self._db = root, db
        self._lock = threading.Lock()  # rows are written from the torch thread and the loop
        self.failures = 0  # writes the disk refused (full, read-only): warned of once
        self._held: Any = None  # the open lock file that keeps other engines out

    def _write(self, sql: str, params: tuple) -> None:
        """One statement in its own transaction. A write the disk refuses fails no call
        (the message lives on in memory, unsaved): it is counted and warned of once."""
        try:
            with self._lock:
                self._db.execute(sql, params)
        except sqlite3.Error as exc:
            self.failures += 1
            if self.failures == 1:
                warnings.warn(
                    f"store {self.root} refused a write ({type(exc).__name__}); messages "
                    f"made from now on may not outlive this process: check its disk",
                    RuntimeWarning,
                    stacklevel=2,
                )

    @classmethod
    def open(
        cls, root: str | Path, identity: dict[str, Any], rebuild: bool = False
    ) -> DurableStore:
        """Open (or create) the store at `root` for a model of `identity`; StoreMismatch
        if it was made with another, StoreError if it cannot be read. `rebuild`: a store
        whose identity differs only in `REBUILDABLE` keys (the same model's files) drops
        its encodings and takes this identity; its messages are encoded again when read."""
        root = Path(root)
        if root.exists() and not root.is_dir():
            raise StoreError(f"store {root} is a file, not a directory: name a directory")
        lock = db = None
        try:
            (root / KV).mkdir(parents=True, exist_ok=True)
            lock = _lock(root)
            db = sqlite3.connect(root / DB, check_same_thread=False, isolation_level=None)
            _ours_or_new(db, root)  # before anything is written to it
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
            db.execute(
                "CREATE TABLE IF NOT EXISTS messages (id INTEGER PRIMARY KEY, "
                "record TEXT NOT NULL, kv TEXT)"
            )
            db.execute(
                "CREATE TABLE IF NOT EXISTS names (name TEXT PRIMARY KEY, "
                "message INTEGER NOT NULL, tenant TEXT NOT NULL, key TEXT NOT NULL)"
            )
            db.execute(
                "CREATE TABLE IF NOT EXISTS turns (run TEXT, key TEXT, n INTEGER, "
                "message INTEGER NOT NULL, PRIMARY KEY (run, key, n))"
            )
        except (OSError, sqlite3.Error, StoreError) as exc:
            for held in (db, lock):
                if held is not None:
                    held.close()
            if isinstance(exc, StoreError):
                raise
            raise StoreError(
                f"store {root} cannot be opened ({type(exc).__name__}: {exc}); check the "
                f"directory's permissions, or name another one"
            ) from exc
        store = cls(root, db)
        store._held = lock
        try:
            store._check(identity, rebuild)
            store._sweep_files()
        except sqlite3.Error as exc:
            store.close()
            raise StoreError(
                f"store {root} cannot be read ({type(exc).__name__}: {exc}); restore the "
                f"directory from a copy, or name another one"
            ) from exc
        except BaseException:
            store.close()
            raise
        return store

    def _check(self, identity: dict[str, Any], rebuild: bool = False) -> None:
        meta = self.meta()
        if not meta:
            self._set_meta(format=str(FORMAT), identity=json.dumps(identity, sort_keys=True))
            return
        if meta.get("format") != str(FORMAT):
            raise StoreError(
                f"store {self.root} is of format {meta.get('format')!r}, this corps reads "
                f"{FORMAT}; open it with the corps that made it, or name another directory"
            )
        try:
            theirs = json.loads(meta.get("identity", ""))
        except json.JSONDecodeError:
            raise StoreError(f"store {self.root}: its model identity is damaged") from None
        keys = identity.keys() | theirs.keys()
        differ = sorted(k for k in keys if identity.get(k) != theirs.get(k))
        if not differ:
            return
        if rebuild and set(differ) <= REBUILDABLE:  # the same tokens: encode them again
            self._drop_encodings()
            self._set_meta(identity=json.dumps(identity, sort_keys=True))
            return
        said = ", ".join(f"{k}: {theirs.get(k)!r} there, {identity.get(k)!r} here" for k in differ)
        how = (
            "open it with store_rebuild=True to drop its encodings and encode its messages "
            "again from their tokens as they are read"
            if set(differ) <= REBUILDABLE
            else "its messages' tokens belong to that model: open it with that one"
        )
        raise StoreMismatch(
            f"store {self.root} was made with another model setup ({said}); its encodings "
            f"would be wrong here: {how}, or name another directory"
        )

    def _drop_encodings(self) -> None:
        """Forget every saved encoding (`store_rebuild`): messages come back without."""
        with self._lock:
            self._db.execute("UPDATE messages SET kv = NULL")
        for f in (self.root / KV).iterdir():
            f.unlink(missing_ok=True)

    def meta(self) -> dict[str, str]:
        with self._lock:
            return dict(self._db.execute("SELECT key, value FROM meta").fetchall())

    def _set_meta(self, **values: str) -> None:
        with self._lock:
            self._db.executemany(
                "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", values.items()
            )

    def origin(self, default: str) -> str:
        """The engine origin handles of this store are pickled with (kept across opens)."""
        got = self.meta().get("origin")
        if got is None:
            self._set_meta(origin=default)
        return got or default

    # ---- the journal: what the message table tells it ----

    def added(self, msg: Message) -> None:
        """A message was made: its row, now (kinds "prefill" and "decode")."""
        if msg.kind == "sink":
            return
        self._write(
            "INSERT OR REPLACE INTO messages (id, record, kv) VALUES (?, ?, NULL)",
            (msg.id, json.dumps(encode(msg))),
        )

    def freed(self, msg: Message) -> None:
        """A message was freed: its record stays (messages encoded over it may be
        encoded again from it) until the table forgets it; its saved encoding goes."""
        if msg.kind == "sink":
            return
        self.added(msg)  # its row rewritten: freed, and naming no encoding
        self._write("DELETE FROM names WHERE message = ?", (msg.id,))
        (self.root / KV / f"{msg.id}.safetensors").unlink(missing_ok=True)

    def forgotten(self, mid: int) -> None:
        """The table dropped a freed record nothing depends on: so does the store."""
        self._write("DELETE FROM messages WHERE id = ?", (mid,))
        self._write("DELETE FROM names WHERE message = ?", (mid,))
        self._write("DELETE FROM turns WHERE message = ?", (mid,))
        self._drop_file(mid)

    # ---- names: what a server calls its messages (`corps.serve.messages`) ----

    def name(self, name: str, mid: int, tenant: str, key: list) -> None:
        """Keep that `name` (a server's opaque id, valid for `tenant`) names message `mid`,
        found again by `key` (a JSON list)."""
        self._write(
            "INSERT OR REPLACE INTO names (name, message, tenant, key) VALUES (?, ?, ?, ?)",
            (name, mid, tenant, json.dumps(key)),
        )

    def unname(self, name: str) -> None:
        self._write("DELETE FROM names WHERE name = ?", (name,))

    def names(self) -> list[tuple[str, int, str, list]]:
        """Every name kept: (name, message id, tenant, key), oldest first."""
        with self._lock:
            rows = self._db.execute("SELECT name, message, tenant, key FROM names ORDER BY rowid")
            rows = rows.fetchall()
        out = []
        for name, mid, tenant, key in rows:
            try:
                out.append((name, int(mid), tenant, json.loads(key)))
            except (ValueError, TypeError):
                continue  # a damaged name: that id is no longer found (a 404, as if freed)
        return out

    # ---- turns: the completed calls of recorded runs (`corps.engine.api.turns`) ----

    def record_turn(self, run: str, key: str, n: int, mid: int) -> None:
        self._write(
            "INSERT OR REPLACE INTO turns (run, key, n, message) VALUES (?, ?, ?, ?)",
            (run, key, n, mid),
        )

    def turn(self, run: str, key: str, n: int) -> int | None:
        """The message the n-th call of `key` in run `run` made, if it was recorded."""
        with self._lock:
            row = self._db.execute(
                "SELECT message FROM turns WHERE run = ? AND key = ? AND n = ?", (run, key, n)
            ).fetchone()
        return None if row is None else int(row[0])

    # ---- encodings ----

    def save(self, msg: Message, k: Tensor, v: Tensor) -> None:
        """Save a message's encoding, K and V (L, n, H, D), and its current record."""
        from safetensors.torch import save_file

        path = self.root / KV / f"{msg.id}.safetensors"
        tmp = path.with_suffix(".tmp")
        k, v = k.contiguous().cpu(), v.contiguous().cpu()
        try:
            save_file({"k": k, "v": v}, str(tmp), metadata={"sum": _digest(k, v)})
            os.replace(tmp, path)
        except OSError:  # a full disk: this encoding is not saved (encoded again when read)
            tmp.unlink(missing_ok=True)
            self.failures += 1
            return
        self._write(
            "INSERT OR REPLACE INTO messages (id, record, kv) VALUES (?, ?, ?)",
            (msg.id, json.dumps(encode(msg)), path.name),
        )

    def update(self, msg: Message) -> None:
        """Rewrite a message's record (its figures, set when its call ended), keeping
        its saved encoding."""
        self._write(
            "UPDATE messages SET record = ? WHERE id = ?", (json.dumps(encode(msg)), msg.id)
        )

    def put(self, msg: Message, k: Tensor, v: Tensor) -> None:
        """The tier's side (`Memory.tier`): an encoding evicted for room is saved (once:
        a file already saved is the same encoding) rather than dropped."""
        if not self.has_kv(msg.id):
            self.save(msg, k, v)

    def discard(self, msg: Message) -> None:
        """The tier's side: a freed message's file goes as its row says (the journal's
        `freed`), nothing to do here."""

    def take(self, msg: Message) -> tuple[Tensor, Tensor] | None:
        """An evicted encoding saved here, to copy back in; None if none was saved."""
        name = self._kv_name(msg.id)
        return None if name is None else self.load_kv(self.root / KV / name)

    def load_kv(self, path: Path) -> tuple[Tensor, Tensor] | None:
        """A saved encoding, or None if its file is missing or unreadable."""
        from safetensors import safe_open

        try:
            with safe_open(str(path), "pt") as f:
                k, v, kept = f.get_tensor("k"), f.get_tensor("v"), f.metadata()["sum"]
        except Exception:  # a damaged file: the message is encoded again instead
            return None
        return (k, v) if kept == _digest(k, v) else None

    def has_kv(self, mid: int) -> bool:
        return self._kv_name(mid) is not None

    def _kv_name(self, mid: int) -> str | None:
        """The file a message's row names for its encoding (never a path), or None."""
        with self._lock:
            row = self._db.execute("SELECT kv FROM messages WHERE id = ?", (mid,)).fetchone()
        ok = row is not None and row[0] is not None and _FILE.fullmatch(row[0]) is not None
        return row[0] if ok else None

    def _drop_file(self, mid: int) -> None:
        self._write("UPDATE messages SET kv = NULL WHERE id = ?", (mid,))
        (self.root / KV / f"{mid}.safetensors").unlink(missing_ok=True)

    def _sweep_files(self) -> None:
        """Delete encoding files no row names (a crash after a rename, before the row)."""
        with self._lock:
            named = {r[0] for r in self._db.execute("SELECT kv FROM messages") if r[0]}
        for f in (self.root / KV).iterdir():
            if f.name not in named:
                f.unlink(missing_ok=True)

    # ---- reading back ----

    def messages(self) -> list[Stored]:
        """Every stored message, by id; a row that cannot be read is a StoreError."""
        try:
            with self._lock:
                rows = self._db.execute("SELECT id, record, kv FROM messages ORDER BY id")
                rows = rows.fetchall()
        except sqlite3.Error as exc:
            raise StoreError(
                f"store {self.root}: its messages cannot be read ({type(exc).__name__}); "
                f"restore the directory from a copy"
            ) from exc
        out = []
        for mid, record, kv in rows:
            try:
                msg = decode(json.loads(record))
            except (ValueError, KeyError, TypeError) as exc:
                raise StoreError(
                    f"store {self.root}: message {mid}'s record is damaged "
                    f"({type(exc).__name__}); restore the directory from a copy"
                ) from None
            named = kv is not None and _FILE.fullmatch(kv) is not None  # never a path
            out.append(Stored(msg, self.root / KV / kv if named else None))
        return out

    def check(self, ids: set[int]) -> None:
        """BrokenInvariant unless the store holds a row for exactly the messages `ids`
        (the table's, the sink aside) and every encoding a row names is a file here.
        A store that refused writes (`failures`) is behind by design: not checked."""
        if self.failures:
            return
        with self._lock:
            rows = self._db.execute("SELECT id, kv FROM messages").fetchall()
        kept = {mid for mid, _ in rows}
        require(kept == ids, f"store rows {sorted(kept ^ ids)[:8]} differ from the table's")
        for mid, kv in rows:
            require(kv is None or (self.root / KV / kv).is_file(), f"message {mid}: no {kv}")

    def close(self) -> None:
        with self._lock:
            self._db.close()
        if self._held is not None:  # the directory is free for another engine
            self._held.close()
            self._held = None


TABLES = {"meta", "messages", "names", "turns"}


def _ours_or_new(db: sqlite3.Connection, root: Path) -> None:
    """StoreError unless the database is empty or a corps store's (its `meta` names a
    format): another program's database is never written to."""
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not tables:
        return
    ours = tables <= TABLES and "meta" in tables
    if ours:  # its meta names a format, or it is one a crash left before it did
        cols = {r[1] for r in db.execute("PRAGMA table_info(meta)")}
        rows = db.execute("SELECT key FROM meta").fetchall() if cols == {"key", "value"} else None
        ours = rows is not None and (("format",) in rows or (not rows and _empty(db, tables)))
    if not ours:
        raise StoreError(
            f"{root / DB} is another program's database (tables: {', '.join(sorted(tables))}), "
            f"not a corps store; it is left as it is: name another directory"
        )


def _empty(db: sqlite3.Connection, tables: set[str]) -> bool:
    """No row in any of `tables` (names of our own tables only)."""
    return all(db.execute(f"SELECT 1 FROM {t} LIMIT 1").fetchone() is None for t in tables)


_FILE = re.compile(r"[0-9]+\.safetensors")  # what an encoding's file is called


def _digest(k: Tensor, v: Tensor) -> str:
    """A checksum of an encoding's bytes: a file cut or zeroed by a crash of the machine
    (not only of the process) reads back as no encoding, never as a wrong one."""
    crc = 0
    for t in (k, v):  # CRC-32: errors, not adversaries (a store is its owner's own)
        crc = zlib.crc32(t.contiguous().view(-1).view(torch.uint8).numpy(), crc)
    return f"{crc:08x}"


def _lock(root: Path) -> Any:
    """Hold `root`'s lock file for this process (released when it is closed or the
    process dies); StoreError if another engine holds it."""
    f = open(root / "lock", "a+")  # held open until the store closes
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise StoreError(
            f"store {root} is open in another engine (this process or another); a store "
            f"serves one engine at a time: close that one, or name another directory"
        ) from None
    return f
