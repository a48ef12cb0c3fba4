"""The captured one-row decode step (corps.engine.model.compiled_decode) against the eager one."""

from __future__ import annotations

import anyio
import pytest
import torch

from corps.cache.errors import InvalidRequest
from corps.engine.config import BadConfig, EngineConfig

from conftest import open_tiny


async def _workflow(engine) -> list:
    """A lone decode over a fresh context (its view one slice), then two decodes over
    one context at once, the longer one going on alone after the shorter ends (its
    view a shared context beside its own tokens); every token's logprob kept."""
    system = await engine.prefill("you are a careful solver", role="system")
    question = await engine.prefill("what is seven times six", role="user", parents=[system])
    lone = await engine.decode(parents=[system, question], max_tokens=12, ignore_eos=True,
                               logprobs=True)  # fmt: skip
    async with anyio.create_task_group() as tg:
        out = {}

        async def one(name: str, n: int, delay: int) -> None:
            for _ in range(delay):  # let the first start alone, so the second joins it
                await anyio.lowlevel.checkpoint()
            out[name] = await engine.decode(
                parents=[system, lone], max_tokens=n, ignore_eos=True, logprobs=True
            )

        tg.start_soon(one, "short", 4, 0)
        tg.start_soon(one, "long", 16, 3)
    return [lone, out["short"], out["long"]]


def assert_same_replies(want: list, got: list) -> None:
    """The same tokens, and each token's logprob within 1e-4 (a captured step fuses
    the norms and casts: not bit for bit)."""
    for a, b in zip(want, got, strict=True):
        assert b.tokens == a.tokens
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) <= 1e-4


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "llama-sink"])
async def test_compiled_step_gives_the_eager_tokens_and_logprobs(tiny_dirs, arch):
    async with open_tiny(tiny_dirs, arch) as eager:
        want = await _workflow(eager)
    async with open_tiny(tiny_dirs, arch, compile=True) as compiled:
        got = await _workflow(compiled)
        graph = compiled.executor.runner.compiled
        stats = compiled.stats()
    assert_same_replies(want, got)
    # both kinds of view went through the graph: the lone decode's single slice, and
    # the long decode alone over the context it had shared
    assert graph.steps["slice"] > 0 and graph.steps["shared"] > 0
    assert stats.compiled_steps == graph.steps["slice"] + graph.steps["shared"]
    assert stats.step_compile_s > 0


async def test_compiled_engine_stores_what_it_encodes(tiny_dirs):
    """A message decoded through the graph reads back as the eager engine's: a later
    call over it (a prefill, eager) gets the same logprobs."""

    async def follow_up(engine) -> tuple:
        system = await engine.prefill("hello world", role="system")
        reply = await engine.decode(parents=[system], max_tokens=10, ignore_eos=True)
        after = await engine.decode(
            parents=[system, reply], max_tokens=3, ignore_eos=True, logprobs=True
        )
        return reply.tokens, after.logprobs

    async with open_tiny(tiny_dirs) as eager:
        want = await follow_up(eager)
    async with open_tiny(tiny_dirs, compile=True) as compiled:
        got = await follow_up(compiled)
    assert got[0] == want[0]
    assert max(abs(x - y) for x, y in zip(want[1], got[1], strict=True)) <= 1e-4


def test_compile_is_refused_where_it_cannot_apply(tiny_dirs):
    with pytest.raises(BadConfig, match="compile"):
        EngineConfig.of(mode="hf", compile=True)
    with pytest.raises(BadConfig, match="compile"):
        EngineConfig.of(device="cuda", compile=True)
    with pytest.raises(BadConfig, match="set compile=True too"):
        EngineConfig.of(compile_gemms="autotune")
    with pytest.raises(BadConfig, match="compile_gemms"):
        EngineConfig.of(compile=True, compile_gemms="fastest")
    with pytest.raises(InvalidRequest, match="contexts='copy'"):
        open_tiny(tiny_dirs, compile=True, contexts="store", attention="torch")


async def test_a_step_the_graph_refuses_runs_eagerly_and_the_graphs_are_given_up(tiny_dirs):
    """If dynamo ever wanted another graph (an assumption of `warm` broken), the step
    runs eagerly with nothing written twice, and so does every later one."""
    async with open_tiny(tiny_dirs) as eager:
        want = await _workflow(eager)
    async with open_tiny(tiny_dirs, compile=True) as compiled:
        graph = compiled.executor.runner.compiled

        def refuse(*args):
            raise RuntimeError("Recompilation triggered with skip_guard_eval_unsafe stance.")

        graph._graph = refuse
        with pytest.warns(RuntimeWarning, match="decoding eagerly"):
            got = await _workflow(compiled)
        assert graph.disabled and graph.steps == {"slice": 0, "shared": 0}
        compiled.check()
    for a, b in zip(want, got, strict=True):
        assert b.tokens == a.tokens and b.logprobs == a.logprobs


def _a_machine_where_fastest_is(kernel: str, home, monkeypatch) -> None:
    """Engines opened from now on find `kernel` timed fastest at every row count (in a
    fresh $CORPS_HOME); skips where this torch cannot run it."""
    from test_tuning import fake

    from corps.engine.model import tuning

    if kernel not in tuning.available():
        pytest.skip(f"{kernel} is not available in this torch")
    timings = fake({b: kernel for b in tuning.ROW_BUCKETS})
    monkeypatch.setenv("CORPS_HOME", str(home))
    monkeypatch.setattr("corps.engine.api.build.measure", lambda *a, **k: timings)


async def test_a_step_over_prepacked_bfloat16_weights_compiles(tiny_dirs, tmp_path, monkeypatch):
    """dtype auto where one row's fastest kernel is oneDNN's prepacked bfloat16 (an Intel
    Xeon with AMX chose it): the graph reads the plain weight unpacked from the blocked
    layout, frozen, which inductor packs its own way, and gives eager's tokens."""
    _a_machine_where_fastest_is("bfloat16-packed", tmp_path, monkeypatch)
    async with open_tiny(tiny_dirs, "qwen2", dtype="auto") as eager:
        want = await _workflow(eager)
    counters = torch._dynamo.utils.counters  # its "inductor" entry may be replaced
    packs = counters["inductor"]["mkldnn_linear_weight_pack_matcher_count"]
    async with open_tiny(tiny_dirs, "qwen2", dtype="auto", compile=True) as compiled:
        got = await _workflow(compiled)
        assert compiled.executor.runner.w.layers[0].qkv.kernel_for(1) == "bfloat16-packed"
        # inductor froze the weights and packed them for its own oneDNN linears
        assert counters["inductor"]["mkldnn_linear_weight_pack_matcher_count"] > packs
        assert compiled.stats().compiled_steps > 0
    for a, b in zip(want, got, strict=True):
        assert b.tokens == a.tokens


async def test_autotuned_gemms_give_the_eager_tokens(tiny_dirs, tmp_path, monkeypatch, capfd):
    """compile_gemms="autotune": inductor times its own C++ GEMM kernels against the
    library's (MKL's, for float32 weights read as they are) for the step's
    products, keeps the faster, and the step gives eager's tokens and logprobs;
    its timing tables stay off the terminal. In float32: which kernel wins is a
    matter of timing, and 16-bit kernels could round a near-tie either way."""
    _a_machine_where_fastest_is("float32", tmp_path, monkeypatch)
    async with open_tiny(tiny_dirs, "qwen2") as eager:
        want = await _workflow(eager)
    counters = torch._dynamo.utils.counters
    tuned = counters["inductor"]["select_algorithm_autotune"]
    # timings inductor kept on disk from an earlier run would be reused untimed
    with torch._inductor.config.patch(autotune_local_cache=False):
        async with open_tiny(tiny_dirs, "qwen2", compile=True, compile_gemms="autotune") as c:
            got = await _workflow(c)
            assert c.stats().compiled_steps > 0
    assert counters["inductor"]["select_algorithm_autotune"] > tuned  # it timed them
    assert "AUTOTUNE" not in capfd.readouterr().err
    for a, b in zip(want, got, strict=True):
        assert b.tokens == a.tokens
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) <= 1e-4


async def test_a_float32_step_over_onednn_packed_weights_compiles(tiny_dirs, tmp_path, monkeypatch):
    """dtype float32 where oneDNN's packed float32 kernel is fastest (the Zen 4 EPYC
    chose it for every row count): the graph calls oneDNN on the eager layout, frozen,
    and gives eager's tokens."""
    _a_machine_where_fastest_is("float32-packed", tmp_path, monkeypatch)
    async with open_tiny(tiny_dirs, "qwen2", dtype="float32") as eager:
        assert eager.executor.runner.w.layers[0].qkv.kernel_for(3) == "float32-packed"
        want = await _workflow(eager)
    async with open_tiny(tiny_dirs, "qwen2", dtype="float32", compile=True) as compiled:
        got = await _workflow(compiled)
        assert compiled.executor.runner.compiled.frozen.layers[0].qkv.packed
        assert compiled.stats().compiled_steps > 0
    for a, b in zip(want, got, strict=True):
        assert b.tokens == a.tokens


async def test_a_process_opens_compiled_engines_of_many_models_and_precisions(tiny_dirs):
    """dynamo keeps the graphs of a code object (guarded on shapes, dtypes and kernel
    names, so engines of other models or precisions add their own) and refuses more
    than its recompile limit (8; 2 here, so that three engines exceed it): engines
    of three configurations open one after the other in one process, each with its
    graph."""
    configs = [("llama", "float32"), ("llama", "bfloat16"), ("qwen3", "float32")]
    with torch._dynamo.config.patch(recompile_limit=2):
        await _open_each(tiny_dirs, configs)


async def _open_each(tiny_dirs, configs) -> None:
    for arch, dtype in configs:
        async with open_tiny(tiny_dirs, arch, dtype=dtype, compile=True, capacity=512) as engine:
            q = await engine.prefill("hello there")
            await engine.decode(parents=[q], max_tokens=6, ignore_eos=True)
            assert engine.executor.runner.compiled.disabled is None
            assert engine.stats().compiled_steps > 0
