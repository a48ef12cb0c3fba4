"""`corps bench runner`: our engine next to HF generate, single stream, same model and dtype.

Decode tokens/s is measured as (N - 1) / (t(N tokens) - t(1 token)) for both, so
prompt encoding and start-up cancel out; prefill tokens/s is one forward pass
over a prompt of the given length. Ours goes through the public async API
(`Engine.open`, `prefill`, `decode`), so the batching loop's overhead counts.
Each figure is the best of `repeats` runs, and the runs alternate between the
two (ours, HF, ours, HF, ...) so that this machine's drift hits both alike.
The "decode bound" row is what a decode step would reach if it did nothing but
stream the weights once through our projections: the machine's limit. With
`--compile`, an engine whose lone decode steps run through the captured graph
(`EngineConfig.compile`) is measured in the same rounds, one per value of
`--compile-gemms` (`EngineConfig.compile_gemms`: the library's products, or
inductor's autotuned ones).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from functools import partial

import anyio
import anyio.to_thread
import torch
from rich.console import Console
from rich.table import Table

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."

Probe = Callable[[], object]


def best_of(probes: dict[str, Probe], repeats: int) -> dict[str, float]:
    """Each probe's best wall time over `repeats` rounds, every probe once per round."""
    best = dict.fromkeys(probes, math.inf)
    for _ in range(repeats):
        for name, probe in probes.items():
            t0 = time.perf_counter()
            probe()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def rates(t: dict[str, float], decode_tokens: int, prefill_tokens: int) -> tuple[float, float]:
    """(decode tok/s, prefill tok/s) from the times of `decode_n`, `decode_1`, `prefill`."""
    return (decode_tokens - 1) / (t["decode_n"] - t["decode_1"]), prefill_tokens / t["prefill"]


def random_ids(vocab: int, n: int) -> list[int]:
    """n ordinary token ids (ids 100-999 of a real vocabulary, past the special ones)."""
    return torch.randint(min(100, vocab // 2), min(1000, vocab), (n,)).tolist()


async def ours_probes(
    engine, decode_tokens: int, prefill_tokens: int, *, rewired: bool = False
) -> dict[str, Probe]:
    """Our decode of N and of 1 token, and one prefill, as coroutine functions.
    `rewired`: each reads the prompt and a second one encoded apart (a context
    choreography rewired, `corps.cache.rewired`), where by default they read the
    prompt alone or nothing (a chain)."""
    q = await engine.prefill(PROMPT)
    parents = [q, await engine.prefill(PROMPT)] if rewired else [q]
    ids = random_ids(len(engine.tokenizer), prefill_tokens)

    async def decode(n: int) -> None:
        engine.free(await engine.decode(parents=parents, max_tokens=n, ignore_eos=True))

    async def prefill() -> None:
        engine.free(await engine.prefill(ids, frame=False, parents=parents if rewired else ()))

    return dict(
        decode_n=partial(decode, decode_tokens), decode_1=partial(decode, 1), prefill=prefill
    )


def measure_bounds(
    path, dtype: str, repeats: int, gemms: Sequence[str | None] = (None,)
) -> dict[str | None, float]:
    """tok/s if a decode step did nothing but stream the weights through our
    projections, for each of `gemms`: None, the eager kernels; an
    `EngineConfig.compile_gemms` value, the products a captured step would run
    (every projection in one graph, compiled as `compile=True` compiles)."""
    from corps.engine.model.names import corps_home
    from corps.engine.model.tuning import weight_format
    from corps.engine.model.weights import load_weights, read_spec, torch_dtype

    mixed, choice = weight_format(dtype, read_spec(path), "cpu", corps_home() / "kernels")
    w = load_weights(path, dtype=torch_dtype(dtype), device="cpu", mixed=mixed, choice=choice)
    projs = [p for lw in w.layers for p in (lw.qkv, lw.o, lw.gate_up, lw.down)] + [w.lm_head]
    xs = [torch.randn(1, p.in_features, dtype=w.dtype) for p in projs]

    def stream() -> None:
        for p, x in zip(projs, xs, strict=True):
            p(x)

    streams = {g: stream if g is None else _compiled_stream(projs, xs, g) for g in gemms}
    return {g: 1 / best_of({"stream": f}, repeats + 2)["stream"] for g, f in streams.items()}


def _compiled_stream(projs, xs, gemms: str) -> Callable[[], None]:
    """The projections (1, K) -> (1, N) as one graph over frozen weights, compiled now."""
    from torch import nn

    from corps.engine.model.decode_module import StepProjection, frozen_compile_config

    class Stream(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.projs = nn.ModuleList(StepProjection(p) for p in projs)

        def forward(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
            return [p(x) for p, x in zip(self.projs, xs, strict=True)]

    graph = torch.compile(Stream().eval(), fullgraph=True)
    with torch.inference_mode(), frozen_compile_config(gemms):
        graph(xs)  # compiles

    def stream() -> None:
        with torch.inference_mode():
            graph(xs)

    return stream


def hf_probes(path, dtype: torch.dtype, decode_tokens: int, prefill_tokens: int):
    """HF generate of N and of 1 token, and one forward over a prompt, as functions."""
    from transformers import AutoTokenizer

    from corps.engine.model.weights import load_hf

    tok = AutoTokenizer.from_pretrained(str(path))
    model = load_hf(path, dtype=dtype).eval()  # a checkpoint, or a dummy model's weights
    ids = tok.apply_chat_template(
        [{"role": "user", "content": PROMPT}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )["input_ids"]

    @torch.inference_mode()
    def gen(n: int) -> None:
        model.generate(
            ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=tok.eos_token_id
        )

    long = torch.tensor([random_ids(model.config.vocab_size, prefill_tokens)])  # (1, P)

    @torch.inference_mode()
    def prefill() -> None:
        model(long, use_cache=True)

    return dict(decode_n=partial(gen, decode_tokens), decode_1=partial(gen, 1), prefill=prefill)


def measure_hf(path, dtype: torch.dtype, decode_tokens: int, prefill_tokens: int, repeats: int):
    """HF's (decode tok/s, prefill tok/s) alone."""
    probes = hf_probes(path, dtype, decode_tokens, prefill_tokens)
    return rates(best_of(probes, repeats), decode_tokens, prefill_tokens)


def measure(
    model: str,
    dtype: str,
    decode_tokens: int,
    prefill_tokens: int,
    repeats: int,
    compile: Sequence[str] = (),
):
    """(ours, HF, bounds, compiled): ours and HF as (decode tok/s, prefill tok/s), run
    alternately; for each of `compile` (`EngineConfig.compile_gemms` values) an
    engine with the captured decode step runs in the same rounds, and `compiled`
    maps each to its (decode tok/s, prefill tok/s, seconds its compile took at
    open). `bounds`: `measure_bounds` by gemms, None for the eager kernels."""
    from contextlib import ExitStack

    from anyio.from_thread import start_blocking_portal

    from corps.engine import Engine
    from corps.engine.model.weights import torch_dtype

    with ExitStack() as stack:
        portal = stack.enter_context(start_blocking_portal())
        engine = stack.enter_context(
            portal.wrap_async_context_manager(Engine.open(model, dtype=dtype))
        )
        made = portal.call(ours_probes, engine, decode_tokens, prefill_tokens)
        probes = {("ours", k): partial(portal.call, f) for k, f in made.items()}
        seconds = {}
        for gemms in compile:
            captured = stack.enter_context(
                portal.wrap_async_context_manager(
                    Engine.open(model, dtype=dtype, compile=True, compile_gemms=gemms)
                )
            )
            seconds[gemms] = captured.stats().step_compile_s
            made = portal.call(ours_probes, captured, decode_tokens, prefill_tokens)
            probes |= {(gemms, k): partial(portal.call, f) for k, f in made.items()}
        hf = hf_probes(engine.model_path, torch_dtype(dtype), decode_tokens, prefill_tokens)

        def on_worker(fn):
            """Run fn on the loop's worker thread, the one our steps run on: torch's
            CPU thread pool belongs to the OS thread that drives it, and two pools
            spinning on two cores slowed whichever ran second by up to 2x."""
            return partial(portal.call, anyio.to_thread.run_sync, fn)

        probes |= {("hf", k): on_worker(f) for k, f in hf.items()}  # each round: all of them
        t = best_of(probes, repeats)
        bounds = on_worker(
            partial(measure_bounds, engine.model_path, dtype, repeats, (None, *compile))
        )()
    by = {w: rates({k: v for (x, k), v in t.items() if x == w}, decode_tokens, prefill_tokens)
          for w in ("ours", "hf", *compile)}  # fmt: skip
    return by["ours"], by["hf"], bounds, {g: (*by[g], seconds[g]) for g in compile}


def main(
    model: str,
    dtypes: list[str],
    decode_tokens: int,
    prefill_tokens: int,
    repeats: int,
    compile: Sequence[str] = (),
) -> None:
    console = Console()
    table = Table(title=f"engine vs HF generate ({model}, CPU threads={torch.get_num_threads()})")
    for col in ("dtype", "metric", "corps tok/s", "HF tok/s", "ratio"):
        table.add_column(col, justify="right")
    for dtype in dtypes:
        ours, hf, bounds, compiled = measure(
            model, dtype, decode_tokens, prefill_tokens, repeats, compile
        )
        names = (f"decode ({decode_tokens} tok)", f"prefill ({prefill_tokens} tok)")
        for name, o, h in zip(names, ours, hf, strict=True):
            table.add_row(dtype, name, f"{o:.1f}", f"{h:.1f}", f"{o / h:.2f}x")
        for gemms, (o, _, _) in compiled.items():
            table.add_row(dtype, f"{names[0]}, compiled step ({gemms} gemms)", f"{o:.1f}",
                          f"{hf[0]:.1f}", f"{o / hf[0]:.2f}x")  # fmt: skip
        for gemms, bound in bounds.items():
            how = "" if gemms is None else f", in a graph ({gemms} gemms)"
            table.add_row(dtype, f"decode bound: weights only{how}", f"{bound:.1f}",
                          f"{hf[0]:.1f}", f"{bound / hf[0]:.2f}x")  # fmt: skip
        console.print(f"{dtype}: decode eager at {ours[0] / bounds[None]:.2f} of the bound")
        for g, (rate, _, secs) in compiled.items():
            own, eager = rate / bounds[g], rate / bounds[None]
            console.print(
                f"{dtype}: decode compiled step ({g} gemms) at {own:.2f} of the bound of "
                f"its own products, {eager:.2f} of the eager kernels' bound; "
                f"compiled in {secs:.1f} s when the engine opened"
            )
    console.print(table)
