"""`corps bench vs-llamacpp`: one chat stream and a tree-of-thoughts-shaped workflow,
corps against llama.cpp on the same GGUF.

The chat stream: one user prompt in the chat template, 128 greedy tokens with
end-of-turn suppressed, timed from the prompt to the last token (prompt included),
best of the runs: tokens per second.

The workflow: B proposals of 48 tokens, V votes of 16 tokens over all proposals,
one final solve of 48 tokens over everything; end-of-turn suppressed so every
implementation decodes exactly the same counts. Implementations, interleaved
run by run on the same machine:

- `llama.cpp`: llama-cpp-python on the embedded model's own GGUF (Q4_1), 2
  threads, calls one at a time as an agent framework drives it, with its
  automatic reuse of the previous prompt's prefix. It runs in a child process
  (`LlamaProcess`): loaded beside torch, its OpenMP runtime (the system libgomp,
  not torch's) slowed corps' 4 x 4 run from ~3.5 s to ~6 s on this machine, so
  in one process the comparison measured the interference, not the engines;
- `corps choreographed` and `corps baseline`: the same calls through the Engine
  API (proposals and votes fused by `decode_many`).

llama-cpp-python is the optional extra `llamacpp` (it compiles llama.cpp when
installed: several minutes); without it the command says so and exits 2.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import statistics
import time
from typing import Any

from pydantic import BaseModel

from corps.engine.config import DEFAULT_DTYPE

VOTE = "Vote for the best approach above, by its number."
SOLVE = "Now solve the problem, following the approach with the most votes."
PROPOSAL_TOKENS, VOTE_TOKENS, SOLVE_TOKENS = 48, 16, 48
STREAM_PROMPT = "Write a short story about a robot who learns to paint."
#: Given to both (without one, SmolLM2's template adds its own default system
#: message to llama.cpp's prompt and not to corps' messages: not one prompt).
SYSTEM = "You are a helpful assistant."
STREAM_TOKENS = 128


class MissingLlamaCpp(RuntimeError):
    """llama-cpp-python is not installed."""


class Stream(BaseModel):
    """One chat stream: tokens per second of each implementation, per run."""

    tokens: int
    rates: dict[str, list[float]]  # implementation -> tokens/s per run
    texts: dict[str, str] = {}  # implementation -> its greedy reply (the last run's)

    def best(self, impl: str) -> float:
        return max(self.rates[impl])

    def agreement(self, impl: str) -> tuple[int, int] | None:
        """How many leading characters of `impl`'s greedy reply are llama.cpp's, of
        llama.cpp's reply: (same, all); None if a reply is missing."""
        mine, theirs = self.texts.get(impl), self.texts.get("llama.cpp")
        if mine is None or theirs is None:
            return None
        same = [a == b for a, b in zip(mine, theirs, strict=False)] + [False]
        return same.index(False), len(theirs)


class Cell(BaseModel):
    branches: int
    voters: int
    seconds: dict[str, list[float]]  # implementation -> wall time per run

    def mean(self, impl: str) -> float:
        return statistics.fmean(self.seconds[impl])


MISSING = (
    "llama-cpp-python is not installed: pip install 'corps[llamacpp]' (it compiles "
    "llama.cpp, a few minutes), then run this again"
)


def load_llama(gguf: str, threads: int = 2):
    try:
        from llama_cpp import Llama
    except ImportError as exc:
        raise MissingLlamaCpp(MISSING) from exc
    return Llama(model_path=gguf, n_ctx=8192, n_threads=threads, verbose=False)


def require_llama_cpp() -> None:
    """Raise MissingLlamaCpp unless llama-cpp-python is installed (without loading it)."""
    if importlib.util.find_spec("llama_cpp") is None:
        raise MissingLlamaCpp(MISSING)


class LlamaProcess:
    """llama.cpp's side of the benchmark in a child process, driven run by run."""

    def __init__(self, gguf: str, model_dir: str, threads: int) -> None:
        ctx = multiprocessing.get_context("spawn")  # no torch state inherited
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, gguf, model_dir, threads), daemon=True)
        self._proc.start()
        child.close()
        try:
            self._reply()  # loaded
        except RuntimeError:
            self.close()
            raise

    def run(self, question: str, branches: int, voters: int) -> float:
        """One workflow run in the child; its wall seconds (measured there)."""
        self._conn.send(("workflow", question, branches, voters))
        return self._reply()

    def stream(self, prompt: str, tokens: int) -> tuple[float, str]:
        """One chat stream in the child; its wall seconds (measured there) and text."""
        self._conn.send(("stream", prompt, tokens))
        return self._reply()

    def close(self) -> None:
        try:
            self._conn.send(None)
        except OSError:
            pass
        self._proc.join(timeout=30)
        if self._proc.is_alive():
            self._proc.kill()
        self._conn.close()

    def _reply(self) -> Any:
        try:
            ok, value = self._conn.recv()
        except EOFError:
            raise RuntimeError(
                f"the llama.cpp process died (exit code {self._proc.exitcode})"
            ) from None
        if not ok:
            raise RuntimeError(f"llama.cpp failed: {value}")
        return value


def _serve(conn, gguf: str, model_dir: str, threads: int) -> None:
    """The child: load llama.cpp and the chat template, then run what the parent asks."""
    try:
        from transformers import AutoTokenizer

        llm = load_llama(gguf, threads)
        tok = AutoTokenizer.from_pretrained(model_dir)

        def render(messages: list[dict[str, str]]) -> str:
            return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

        conn.send((True, None))
        while (job := conn.recv()) is not None:
            kind, *args = job
            run = llama_workflow if kind == "workflow" else llama_stream
            conn.send((True, run(llm, render, *args)))
    except Exception as exc:  # the parent raises it
        conn.send((False, repr(exc)))
    finally:
        conn.close()


def llama_stream(llm, render, prompt: str, tokens: int) -> tuple[float, str]:
    """One chat stream through llama.cpp from an empty context; wall seconds, text."""
    ban = {t: -1e9 for t in (llm.token_eos(), *llm.tokenize(b"<|im_end|>", special=True))}
    llm.reset()  # no prefix kept from the run before: the prompt is encoded
    t0 = time.perf_counter()
    out = llm.create_completion(
        render([{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]),
        max_tokens=tokens,
        temperature=0.0,
        logit_bias=ban,
    )
    wall = time.perf_counter() - t0
    assert out["usage"]["completion_tokens"] == tokens
    return wall, out["choices"][0]["text"]


async def corps_stream(engine, prompt: str, tokens: int) -> tuple[float, str]:
    """The same stream through the Engine API; wall seconds and text (everything freed
    after)."""
    t0 = time.perf_counter()
    system = await engine.prefill(SYSTEM, role="system")
    q = await engine.prefill(prompt, role="user", parents=[system])
    reply = await engine.decode(
        parents=[system, q], max_tokens=tokens, temperature=0.0, ignore_eos=True
    )
    wall = time.perf_counter() - t0
    assert len(reply.generated) == tokens
    text = reply.text
    for h in (reply, q, system):
        engine.free(h)
    return wall, text


def llama_workflow(llm, render, question: str, branches: int, voters: int) -> float:
    """One run through llama.cpp, calls one at a time; wall seconds."""
    ban = {t: -1e9 for t in (llm.token_eos(), *llm.tokenize(b"<|im_end|>", special=True))}

    def complete(messages: list[dict[str, str]], header: str, n: int) -> str:
        out = llm.create_completion(
            render(messages) + header, max_tokens=n, temperature=0.0, logit_bias=ban
        )
        return header + out["choices"][0]["text"]

    t0 = time.perf_counter()
    base = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    props = [complete(base, f"Approach {i + 1}:", PROPOSAL_TOKENS) for i in range(branches)]
    msgs = base + [{"role": "assistant", "content": p} for p in props]
    msgs.append({"role": "user", "content": VOTE})
    votes = [complete(msgs, f"Vote {j + 1}:", VOTE_TOKENS) for j in range(voters)]
    msgs += [{"role": "assistant", "content": v} for v in votes]
    msgs.append({"role": "user", "content": SOLVE})
    complete(msgs, "", SOLVE_TOKENS)
    return time.perf_counter() - t0


async def corps_workflow(engine, question: str, branches: int, voters: int) -> float:
    """The same calls through the Engine API; wall seconds (everything freed after)."""
    fixed = dict(ignore_eos=True, temperature=0.0)
    t0 = time.perf_counter()
    system = await engine.prefill(SYSTEM, role="system")
    q = await engine.prefill(question, parents=[system])
    props = await engine.decode_many(
        [
            dict(
                parents=[system, q],
                header=f"Approach {i + 1}:",
                max_tokens=PROPOSAL_TOKENS,
                **fixed,
            )
            for i in range(branches)
        ]
    )
    vote = await engine.prefill(VOTE, parents=[system, q, *props])
    votes = await engine.decode_many(
        [
            dict(
                parents=[system, q, *props, vote],
                header=f"Vote {j + 1}:",
                max_tokens=VOTE_TOKENS,
                **fixed,
            )
            for j in range(voters)
        ]
    )
    solve = await engine.prefill(SOLVE, parents=[system, q, *props, *votes])
    final = await engine.decode(
        parents=[system, q, *props, *votes, solve], max_tokens=SOLVE_TOKENS, **fixed
    )
    wall = time.perf_counter() - t0
    assert len(final.generated) == SOLVE_TOKENS
    for h in [final, solve, *votes, vote, *props, q, system]:
        engine.free(h)
    return wall


async def measure(
    cells: list[tuple[int, int]],
    *,
    runs: int = 2,
    warmup: int = 1,
    threads: int = 2,
    dtype: str = DEFAULT_DTYPE,
    weights: str = "auto",
    stream_runs: int = 3,
    compile: bool = False,
    precompiled: str = "build",
) -> tuple[Stream | None, list[Cell]]:
    """The chat stream (`stream_runs` runs, none if 0) and each B x V cell, every
    implementation interleaved run by run. corps runs its `weights` (and, for the
    stream, the dense path too unless that is what `weights` is); `compile`: corps'
    lone one-row decode steps through a captured graph (`EngineConfig.compile`);
    `precompiled`: its setting for corps' engines ("build", the default here: the
    package a user's first engine has built for the next, built now if missing). The
    stream also runs an engine with the step eager (precompiled="off") beside it."""
    from contextlib import AsyncExitStack, closing

    from corps.engine import Engine
    from corps.engine.model.names import gguf_file, resolve_model
    from corps.patterns.samples import MATH_PROBLEMS

    require_llama_cpp()
    gguf, model_dir = str(gguf_file("smollm2-135m")), str(resolve_model("smollm2-135m"))
    out = []
    async with AsyncExitStack() as stack:
        opened = {}
        for name, mode, w, pre in (
            ("choreographed", "choreographed", weights, precompiled),
            ("baseline", "baseline", weights, precompiled),
            ("eager", "choreographed", weights, "off"),
            ("dense", "choreographed", "dense", "off"),
        ):
            if name in ("dense", "eager") and not stream_runs:
                continue
            if (name == "dense" and weights == "dense") or (name == "eager" and pre == precompiled):
                continue
            if name == "baseline" and not cells:
                continue
            engine = Engine.open("smollm2-135m", mode=mode, dtype=dtype, weights=w,
                                 compile=compile, precompiled=pre)  # fmt: skip
            opened[name] = await stack.enter_async_context(engine)
        llama = stack.enter_context(closing(LlamaProcess(gguf, model_dir, threads)))
        stream = await _stream(llama, opened, stream_runs, warmup) if stream_runs else None
        for b, v in cells:
            seconds: dict[str, list[float]] = {"llama.cpp": [], "choreographed": [], "baseline": []}
            for r in range(warmup + runs):
                question = MATH_PROBLEMS[r % len(MATH_PROBLEMS)][0]
                got = {"llama.cpp": llama.run(question, b, v)}
                for mode in ("choreographed", "baseline"):
                    got[mode] = await corps_workflow(opened[mode], question, b, v)
                if r >= warmup:
                    for k, sec in got.items():
                        seconds[k].append(sec)
            out.append(Cell(branches=b, voters=v, seconds=seconds))
    return stream, out


async def _stream(llama: LlamaProcess, engines: dict, runs: int, warmup: int) -> Stream:
    """The chat stream through llama.cpp and each corps engine, interleaved."""
    impls = ["llama.cpp", "corps"] + [f"corps {k}" for k in ("eager", "dense") if k in engines]
    rates: dict[str, list[float]] = {k: [] for k in impls}
    n = STREAM_TOKENS
    for r in range(warmup + runs):
        got = {
            "llama.cpp": llama.stream(STREAM_PROMPT, n),
            "corps": await corps_stream(engines["choreographed"], STREAM_PROMPT, n),
        }
        for k in ("eager", "dense"):
            if k in engines:
                got[f"corps {k}"] = await corps_stream(engines[k], STREAM_PROMPT, n)
        if r >= warmup:
            for k, (sec, _) in got.items():
                rates[k].append(n / sec)
    texts = {k: text for k, (_, text) in got.items()}
    return Stream(tokens=n, rates=rates, texts=texts)


def stream_table(stream: Stream, weights: str, precompiled: str = "build") -> Any:
    from rich.table import Table

    t = Table(
        title=f"one chat stream ({stream.tokens} greedy tokens, prompt included), tokens/s, "
        f"best of {len(stream.rates['llama.cpp'])} runs"
    )
    for col in ("implementation", "tokens/s", "/ llama.cpp", "greedy text as llama.cpp's"):
        t.add_column(col, justify="right")
    base = stream.best("llama.cpp")
    step = "precompiled step" if precompiled != "off" else "eager step"
    label = {
        "corps": f"corps (weights={weights}, {step})",
        "corps eager": f"corps (weights={weights}, eager step)",
        "corps dense": "corps (weights=dense, eager step)",
    }
    for impl in stream.rates:
        ratio = stream.best(impl) / base
        style = "green" if ratio >= 1 else "red"
        same = stream.agreement(impl) if impl != "llama.cpp" else None
        t.add_row(label.get(impl, "llama.cpp (its GGUF)"), f"{stream.best(impl):.1f}",
                  f"[{style}]{ratio:.2f}x[/]",
                  "" if same is None else f"first {same[0]} of {same[1]} chars")  # fmt: skip
    return t


def table(cells: list[Cell], dtype: str = DEFAULT_DTYPE, weights: str = "auto") -> Any:
    from rich.table import Table

    t = Table(
        title=f"tree-of-thoughts shape ({PROPOSAL_TOKENS}/{VOTE_TOKENS}/{SOLVE_TOKENS} tokens), "
        f"wall seconds, mean of {len(cells[0].seconds['llama.cpp']) if cells else 0} runs, "
        f"corps dtype {dtype}, weights {weights}"
    )
    for col in ("B x V", "llama.cpp (Q4_1)", "corps choreographed", "corps baseline"):
        t.add_column(col, justify="right")
    t.add_column("llama.cpp / choreographed", justify="right")
    for c in cells:
        ratio = c.mean("llama.cpp") / c.mean("choreographed")
        style = "green" if ratio > 1 else "red"
        t.add_row(
            f"{c.branches} x {c.voters}",
            f"{c.mean('llama.cpp'):.2f}",
            f"{c.mean('choreographed'):.2f}",
            f"{c.mean('baseline'):.2f}",
            f"[{style}]{ratio:.2f}x[/]",
        )
    return t
