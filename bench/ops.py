"""`corps bench ops`: the torch ops a prefill runs, per step and per layer, counted on
a CPU as a proxy for the kernels a GPU launches (`corps.engine.counting_ops`).

Why: on a GPU a prefill step of a few thousand tokens is bound by its launches
(an H200 ran a 1B model's 2,048-token prompt as four 512-token steps: 2,344
kernels, the GPU busy 16 of 63 ms). Counted here, per `step_tokens` setting, on
the prefill path CUDA takes (attention "flex": dense causal attention for a lone
prompt, one FlexAttention launch over a block mask for spans over a shared
context; graphs off):

- one prompt of `prompt_tokens` tokens;
- `spans` spans of `span_tokens` tokens over one shared `context_tokens` context.

Reported per section: the engine's steps, the ops that launch kernels (views and
metadata left out) in all and per step and layer, and the most frequent ops.
Nothing is timed.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from corps.bench.runner import random_ids


@dataclass(frozen=True)
class OpFigures:
    section: str
    step_tokens: int
    steps: int
    kernels: int  # ops that launch kernels, in all
    layers: int
    ops: tuple[tuple[str, int], ...]  # every kernel-launching call, most run first

    @property
    def per_step_layer(self) -> float:
        return self.kernels / max(1, self.steps) / self.layers


async def count(engine, section: str, run) -> OpFigures:
    """The ops of `await run()` on `engine` (whose steps it counts)."""
    from corps.engine.exec.instruments import counting_ops

    steps = engine.stats().steps
    async with counting_ops() as ops:
        await run()
    layers = engine.executor.runner.spec.num_layers
    most = tuple((op, n) for op, n in ops.ops.most_common() if n)
    return OpFigures(section, engine.config.step_tokens or 0, engine.stats().steps - steps,
                     ops.kernels, layers, most)  # fmt: skip


async def measure(model: str, dtype: str, step_tokens: int, prompt: int, spans: int,
                  span_tokens: int, context: int) -> list[OpFigures]:  # fmt: skip
    from corps.engine import Engine

    async with Engine.open(model, dtype=dtype, attention="flex", graphs="off",
                           step_tokens=step_tokens) as engine:  # fmt: skip
        vocab = engine.tokenizer.vocab_size

        async def one_prompt() -> None:
            engine.free(await engine.prefill(random_ids(vocab, prompt), frame=False))

        ctx = await engine.prefill(random_ids(vocab, context), frame=False)
        requests = [dict(message=random_ids(vocab, span_tokens), frame=False, parents=[ctx])
                    for _ in range(spans)]  # fmt: skip

        async def many() -> None:
            for h in await engine.prefill_many(requests):
                engine.free(h)

        await one_prompt()  # warm: first-use work is not the steady state
        out = [await count(engine, f"one prompt of {prompt}", one_prompt)]
        name = f"{spans} spans of {span_tokens} over {context} shared"
        out.append(await count(engine, name, many))
        engine.free(ctx)
    return out


def table(model: str, figures: list[OpFigures]) -> Table:
    t = Table(title=f"torch ops of a prefill ({model}; kernels: views and metadata left out)")
    for col in ("section", "step_tokens", "steps", "kernels", "per step and layer", "most run"):
        t.add_column(col, justify="left" if col in ("section", "most run") else "right")
    for f in figures:
        top = ", ".join(f"{op} {n}" for op, n in f.ops[:5])
        t.add_row(f.section, str(f.step_tokens), str(f.steps), f"{f.kernels:,}",
                  f"{f.per_step_layer:.1f}", top)  # fmt: skip
    return t


def main(model: str, dtype: str, step_tokens: list[int], **sizes: int) -> list[OpFigures]:
    import anyio

    figures: list[OpFigures] = []
    for n in step_tokens:
        figures += anyio.run(lambda n=n: measure(model, dtype, n, **sizes))
    Console().print(table(model, figures))
    return figures
