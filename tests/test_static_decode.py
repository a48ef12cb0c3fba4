"""engine/model/static_decode.py: decode-only steps over static buffers (what a CUDA
graph replays) give exactly the ordinary step's tokens; only capture needs a GPU."""

from __future__ import annotations

import pytest
import torch

from corps.engine.config import BadConfig, EngineConfig
from corps.engine.model.static_decode import BUCKETS, bucket_for, width_for

from conftest import DEVICE, open_tiny


async def scenario(engine, tokens: int = 10) -> list[list[int]]:
    """Choreography the static step must read as the ordinary one does: a shared
    system prompt, parallel parents, a gap, a reordering, calls joining a live
    shared context, batches padded to a bucket (3, 5, 6 calls), and a lone chain."""
    sys = await engine.prefill("You are a careful solver of small puzzles.", role="system")
    q1 = await engine.prefill("What is seven times six?", parents=[sys])
    q2 = await engine.prefill("Name a prime above ten.", parents=[sys], offsets=[0])
    kw = dict(max_tokens=tokens, ignore_eos=True)
    first = await engine.decode_many(
        [
            dict(parents=[sys, q1], **kw),
            dict(parents=[sys, q2], **kw),
            dict(parents=[sys, q1, q2], **kw),  # q2 read where it was not encoded
        ]
    )
    gap = sys.length + q1.length + 7
    second = await engine.decode_many(
        [dict(parents=[sys, q2, q1], **kw)]  # reordered
        + [dict(parents=[sys, q1], offsets=[0, gap], **kw)]  # a gap before q1
        + [
            dict(parents=[sys, q1, a], max_tokens=tokens - 3 + i, ignore_eos=True)
            for i, a in enumerate(first)
        ]
    )
    chain = await engine.decode(parents=[sys, q1, first[0]], max_tokens=tokens, ignore_eos=True)
    return [h.generated for h in [*first, *second, chain]]


@pytest.mark.parametrize("attention", ["torch", "triton"])
async def test_static_steps_give_the_ordinary_steps_tokens(tiny_dirs, attention, monkeypatch):
    if attention == "triton":
        pytest.importorskip("triton")
    monkeypatch.setenv("CORPS_ATTENTION", attention)
    got = {}
    for graphs in ("off", "static"):
        async with open_tiny(tiny_dirs, "llama", graphs=graphs) as engine:
            # Triton runs interpreted here: a few tokens a call are enough
            got[graphs] = await scenario(engine, 10 if attention == "torch" else 4)
            stats = engine.stats()
            assert (stats.static_steps > 0) == (graphs == "static")
            assert stats.graphs_captured == 0  # nothing is captured without a GPU
            engine.check()  # the scratch rows are no one's: every slot and range accounted
    assert got["static"] == got["off"]


async def test_every_model_family_decodes_the_same_through_the_buffers(tiny_dirs):
    for name in ("qwen3", "llama3-scaled"):
        got = []
        for graphs in ("off", "static"):
            async with open_tiny(tiny_dirs, name, graphs=graphs) as engine:
                q = await engine.prefill("the quick brown fox jumps")
                hs = await engine.decode_many(
                    [
                        dict(parents=[q], max_tokens=8, ignore_eos=True, seed=s, temperature=1.0)
                        for s in range(3)
                    ]
                )
                got.append([h.generated for h in hs])
        assert got[0] == got[1], name


async def test_steps_the_buffers_cannot_describe_run_as_before(tiny_dirs):
    """Prompt chunks, forced tokens and contexts read from the store take the
    ordinary step; the static one only ever sees one-row decodes."""
    store = dict(graphs="static", contexts="store", attention="torch")  # store: torch only
    async with open_tiny(tiny_dirs, "llama", **store) as engine:
        q = await engine.prefill("hello there, world")
        await engine.decode_many([dict(parents=[q], max_tokens=4) for _ in range(2)])
        assert engine.stats().static_steps == 0  # every view read its context from the store
    async with open_tiny(tiny_dirs, "llama", graphs="static") as engine:
        q = await engine.prefill("hello there, world")
        forced = await engine.decode(parents=[q], force=[5, 6, 7, 8])
        assert forced.generated == [5, 6, 7, 8]
        runs = engine.stats().static_steps
        await engine.decode(parents=[q], max_tokens=4, ignore_eos=True)
        assert engine.stats().static_steps > runs


async def test_closing_drops_the_buffers_and_keeps_the_counts(tiny_dirs):
    engine = open_tiny(tiny_dirs, "llama", graphs="static")
    async with engine:
        q = await engine.prefill("hello world")
        await engine.decode_many([dict(parents=[q], max_tokens=3) for _ in range(3)])
        runs = engine.stats().static_steps
        static = engine.executor.runner.static  # internal: the buffers themselves
        assert static.steps and runs > 0
    assert not static.steps and static.pool is None
    assert engine.stats().static_steps == runs


async def test_a_refused_capture_warns_and_decodes_eagerly(tiny_dirs):
    """Stand-in for a kernel CUDA cannot capture: the step still runs, over the
    buffers, and so does every later one."""
    async with open_tiny(tiny_dirs, "llama", graphs="static") as engine:
        q = await engine.prefill("hello world")
        want = (await engine.decode(parents=[q], max_tokens=6, ignore_eos=True)).generated
        static = engine.executor.runner.static  # internal: make it try to capture
        static.steps.clear()

        def refuse(step, key):
            raise RuntimeError("operation not permitted when stream is capturing")

        static.capture, static._capture = True, refuse
        with pytest.warns(RuntimeWarning, match="capturing a decode step failed"):
            got = await engine.decode(parents=[q], max_tokens=6, ignore_eos=True)
        assert got.generated == want and not static.capture
        assert "not permitted" in static.refused


def test_buckets_and_widths():
    assert [bucket_for(n) for n in (1, 2, 3, 5, 16, 17, 512)] == [1, 2, 4, 8, 16, 32, 512]
    assert bucket_for(BUCKETS[-1] + 1) is None
    assert [width_for(n) for n in (1, 64, 65, 1000, 1024, 1025)] == [64, 64, 128, 1024, 1024, 2048]


def test_capture_needs_cuda_and_hf_mode_has_no_static_step():
    with pytest.raises(BadConfig, match="graphs='static'"):
        EngineConfig.of(graphs="capture", device="cpu")
    with pytest.raises(BadConfig, match="mode='hf'"):
        EngineConfig.of(graphs="static", mode="hf")
    assert EngineConfig.of().graphs == "auto"


@pytest.mark.skipif(DEVICE != "cuda", reason="captures CUDA graphs: pytest --device cuda")
async def test_captured_graphs_replay_the_eager_tokens(tiny_dirs):
    got = {}
    for graphs in ("off", "capture"):
        async with open_tiny(tiny_dirs, "llama", graphs=graphs) as engine:
            got[graphs] = await scenario(engine)
            if graphs == "capture":
                stats = engine.stats()
                assert stats.graphs_captured >= 3 and stats.static_steps > stats.graphs_captured
    assert got["capture"] == got["off"]
    torch.cuda.synchronize()
