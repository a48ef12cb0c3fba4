"""`EngineConfig.store`: an engine's messages kept in a directory (`corps.cache.durable`).

What a store is made for is the model's identity: a fingerprint of every file of the
model's directory (weights, config, tokenizer: the tokens and their encodings
depend on all of them) and of the adapter's, the weight format that ran, the dtype
asked and the KV store's, its shapes, and the mode. A store opened with an identity
that differs in any of these is refused (`StoreMismatch`, naming what differs).

A fingerprint reads each file's name, size and first and last MiB (blake2b), not its
whole content: an 8B model's 16 GB would take a minute to hash at every open. Two
files that differ only in their middle are not told apart; weights of another
training run never are that alike.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from corps.cache.durable import DurableStore
from corps.engine.config import EngineConfig
from corps.engine.exec.executor import Executor

#: bytes read at each end of a file for its fingerprint
EDGE = 1 << 20


def fingerprint(root: Path) -> str:
    """A digest of every regular file under `root`: names, sizes, first and last MiB."""
    h = hashlib.blake2b(digest_size=16)
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        size = f.stat().st_size
        h.update(f"{f.relative_to(root)}\0{size}\0".encode())
        with open(f, "rb") as fh:
            h.update(fh.read(EDGE))
            if size > 2 * EDGE:
                fh.seek(size - EDGE)
                h.update(fh.read(EDGE))
    return h.hexdigest()


def identity(cfg: EngineConfig, path: Path, source: str, executor: Executor) -> dict[str, Any]:
    """What a store made by this engine's messages depends on (see the module doc)."""
    return {
        "model": fingerprint(path),
        "adapter": fingerprint(Path(cfg.adapter)) if cfg.adapter is not None else None,
        "weights": source,
        "dtype": cfg.dtype,
        "kv": executor.kv_layout(),
        "mode": cfg.mode,
    }


def open_store(cfg: EngineConfig, path: Path, source: str, executor: Executor) -> DurableStore:
    """Open `cfg.store` for `executor` and read its messages back (torch thread, before
    the engine starts): the executor keeps its messages in it from now on."""
    store = DurableStore.open(
        cfg.store, identity(cfg, path, source, executor), rebuild=cfg.store_rebuild
    )
    try:
        executor.keep_in(store)
    except BaseException:
        store.close()
        raise
    return store
