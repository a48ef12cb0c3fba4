"""The engine worker (corps.patterns.cluster.worker) without Ray: its thread count and runs."""

from __future__ import annotations

import torch

from corps.engine.config import EngineConfig
from corps.engine.exec.torch_thread import TORCH
from corps.patterns.cluster.worker import EngineWorker


async def test_the_thread_count_is_set_where_the_steps_run(tiny_dirs):
    before = TORCH.call(torch.get_num_threads)  # the torch thread runs, its count set
    worker = EngineWorker(
        EngineConfig.of(str(tiny_dirs["llama"]), dtype="float32", capacity=1024), "w0", threads=1
    )
    try:
        info = await worker.start()
        assert info["threads"] == 1 and info["name"] == "w0"
        assert TORCH.call(torch.get_num_threads) == 1  # not only on the caller's thread
        got = await worker.run("multi-qa", dict(questions=["What is 2+2?"], max_tokens=3,
                                                constrained=False, answers=None))  # fmt: skip
        assert "result" in got, got
    finally:
        await worker.stop()
        TORCH.call(torch.set_num_threads, before)
        torch.set_num_threads(before)
