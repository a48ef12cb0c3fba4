"""`corps bench runner`: our runner next to HF generate, single stream, same model and dtype.

Decode tokens/s is measured as (N - 1) / (t(N tokens) - t(1 token)) for both, so
prompt encoding and start-up cancel out; prefill tokens/s is one forward pass
over a prompt of the given length. Each figure is the best of `repeats` runs.
The "decode bound" row is what a decode step would reach if it did nothing but
stream the weights once through our projections: the machine's limit.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from rich.console import Console
from rich.table import Table

from corps.engine.requests import DecodeRequest, PrefillRequest
from corps.engine.sampling import SamplingParams

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def best(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def measure_ours(
    engine, decode_tokens: int, prefill_tokens: int, repeats: int
) -> tuple[float, float]:
    core = engine._core
    (q,), _ = core.prefill_many([PrefillRequest(PROMPT)])

    def decode(n: int) -> Callable[[], object]:
        sp = SamplingParams(max_tokens=n, ignore_eos=True)

        def run() -> None:
            (h,) = core.decode_many([DecodeRequest(parents=[q], sampling=sp)])
            core.free(h)

        return run

    t_n, t_1 = best(decode(decode_tokens), repeats), best(decode(1), repeats)
    ids = torch.randint(100, 1000, (prefill_tokens,)).tolist()

    def prefill() -> None:
        (h,), _ = core.prefill_many([PrefillRequest(ids, frame=False)])
        core.free(h)

    return (decode_tokens - 1) / (t_n - t_1), prefill_tokens / best(prefill, repeats)


def measure_bound(engine, repeats: int) -> float:
    """tok/s if a decode step did nothing but stream the weights through our projections."""
    w = engine._core.runner.w
    projs = [p for lw in w.layers for p in (lw.qkv, lw.o, lw.gate_up, lw.down)] + [w.lm_head]
    xs = [torch.randn(1, p.w.shape[1], dtype=w.dtype) for p in projs]

    def stream() -> None:
        for p, x in zip(projs, xs, strict=True):
            p(x)

    return 1 / best(stream, repeats + 2)


def measure_hf(path, dtype: torch.dtype, decode_tokens: int, prefill_tokens: int, repeats: int):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval()
    ids = tok.apply_chat_template(
        [{"role": "user", "content": PROMPT}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )["input_ids"]

    def gen(n: int) -> Callable[[], object]:
        def run() -> None:
            with torch.inference_mode():
                model.generate(
                    ids,
                    max_new_tokens=n,
                    min_new_tokens=n,
                    do_sample=False,
                    pad_token_id=tok.eos_token_id,
                )

        return run

    t_n, t_1 = best(gen(decode_tokens), repeats), best(gen(1), repeats)
    long = torch.randint(100, 1000, (1, prefill_tokens))

    def prefill() -> None:
        with torch.inference_mode():
            model(long, use_cache=True)

    return (decode_tokens - 1) / (t_n - t_1), prefill_tokens / best(prefill, repeats)


def main(
    model: str, dtypes: list[str], decode_tokens: int, prefill_tokens: int, repeats: int
) -> None:
    from corps.engine.engine import DTYPES, Engine

    console = Console()
    table = Table(title=f"runner vs HF generate ({model}, CPU threads={torch.get_num_threads()})")
    for col in ("dtype", "metric", "corps tok/s", "HF tok/s", "ratio"):
        table.add_column(col, justify="right")
    for dtype in dtypes:
        engine = Engine.load(model, dtype=dtype)
        ours = measure_ours(engine, decode_tokens, prefill_tokens, repeats)
        bound = measure_bound(engine, repeats)
        hf = measure_hf(engine.model_path, DTYPES[dtype], decode_tokens, prefill_tokens, repeats)
        names = (f"decode ({decode_tokens} tok)", f"prefill ({prefill_tokens} tok)")
        for name, o, h in zip(names, ours, hf, strict=True):
            table.add_row(dtype, name, f"{o:.1f}", f"{h:.1f}", f"{o / h:.2f}x")
        table.add_row(
            dtype,
            "decode bound: weights only",
            f"{bound:.1f}",
            f"{hf[0]:.1f}",
            f"{bound / hf[0]:.2f}x",
        )
        del engine
    console.print(table)


if __name__ == "__main__":
    import typer

    from corps.cli.app import bench_runner

    typer.run(bench_runner)
