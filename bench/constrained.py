"""`corps bench constrained`: what constraints cost and what they fix, side by side.

- libraries: each constrained-decoding library installed (llguidance, which corps
  uses; xgrammar and outlines-core when present) on the model's tokenizer: one-off
  tokenizer preparation, compile time of a JSON schema, a regex and a choice, and
  the time to compute the masks of 1 and 16 matchers per step.
- throughput: 16 concurrent decodes constrained to a JSON schema (a long free
  string field, so every call runs to max_tokens) against the same 16 unconstrained,
  alternated, tokens/s and the ratio with a bootstrap 95% interval (target >= 0.9).
- jump-forward: the patterns' JSON forms (the debate moderator's verdict, a
  player's decision), greedy, decoded with and without jump-forward: forward
  steps, and whether the text is the same (target: >= 1.5x fewer steps).
- patterns: each built-in pattern whose outputs have a fixed form, over `seeds`
  seeds, constrained and free: parse errors, and the compile time of its
  constraints (cached per engine).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from corps.bench.workflow import Ratio, bootstrap
from corps.patterns import forms

SCHEMA = {
    "type": "object",
    "properties": {
        "decision": {"enum": ["continue", "stop"]},
        "answer": {"type": "string", "maxLength": 40},
        "reason": {"type": "string", "maxLength": 200},
    },
    "required": ["decision", "answer", "reason"],
    "additionalProperties": False,
}
SAMPLES = {
    "json": '{"decision": "stop", "answer": "42", "reason": "both sides agree on the count"}',
    "regex": "ANSWER: 1234.5",
    "choice": "DEFECT",
}
REGEX = r"ANSWER: -?[0-9]+(\.[0-9]+)?"
CHOICES = ["COOPERATE", "DEFECT"]
#: Keeps every call of the throughput test running to max_tokens (never complete).
#: (No `pattern` with the length: llguidance's lexer then took ~3 ms per mask.)
LONG_TEXT = {
    "type": "object",
    "properties": {"text": {"type": "string", "minLength": 4000}},
    "required": ["text"],
}
PATTERNS = {
    "tree_of_thoughts": {},
    "debate": {"rounds": 2},
    "parallel_debate": {"agents": 3, "rounds": 2},
    "branch_solve_merge": {},
    "multi_qa": {},
    "prisoners_dilemma": {"rounds": 1},
}


class LibRow(BaseModel):
    library: str
    version: str
    tokenizer_ms: float | None = None
    compile_ms: dict[str, float | None] = {}
    mask_ms: dict[str, float | None] = {}  # "x1" / "x16": per step, JSON schema
    error: str | None = None


class Throughput(BaseModel):
    calls: int
    tokens: int
    free_tok_s: list[float]
    constrained_tok_s: list[float]
    ratio: Ratio  # constrained / free tokens per second


class Jump(BaseModel):
    form: str
    steps_without: int
    steps_with: int
    tokens_jumped: int
    same_text: bool
    text: str


class PatternErrors(BaseModel):
    pattern: str
    seeds: int
    errors_free: int
    errors_constrained: int
    runs_with_errors_free: int
    runs_with_errors_constrained: int
    constraints: int
    compile_ms: float


class Report(BaseModel):
    model: str
    libraries: list[LibRow] = []
    throughput: Throughput | None = None
    jumps: list[Jump] = []
    patterns: list[PatternErrors] = []


# ---- libraries ----


def _ms(f: Callable[[], Any], repeat: int = 3) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = f()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3, out


def _masks(step: Callable[[int], None], advance: Callable[[int], None], ids: list[int]) -> float:
    """Mean ms per step of computing masks, advancing along `ids` (a valid text)."""
    total = 0.0
    for t in ids:
        t0 = time.perf_counter()
        step(t)
        total += time.perf_counter() - t0
        advance(t)
    return total / len(ids) * 1e3


def _llguidance(tok) -> LibRow:
    import llguidance
    import llguidance.hf
    from llguidance.torch import allocate_token_bitmask, fill_next_token_bitmask_par

    row = LibRow(library="llguidance", version=llguidance.__version__)
    row.tokenizer_ms, lt = _ms(lambda: llguidance.hf.from_tokenizer(tok), 1)
    m = llguidance.LLMatcher
    grammars = {
        "json": m.grammar_from_json_schema(json.dumps(SCHEMA)),
        "regex": m.grammar_from_regex(REGEX),
        "choice": m.grammar_from_lark('start: "COOPERATE" | "DEFECT"'),
    }
    for name, g in grammars.items():
        row.compile_ms[name], _ = _ms(lambda g=g: m(lt, g))
    ex, ids = llguidance.LLExecutor(), tok.encode(SAMPLES["json"], add_special_tokens=False)
    for n in (1, 16):
        ms = [m(lt, grammars["json"]) for _ in range(n)]
        mask = allocate_token_bitmask(n, lt.vocab_size)
        row.mask_ms[f"x{n}"] = _masks(
            lambda _t, ms=ms, mask=mask: fill_next_token_bitmask_par(
                ex, [(x, i) for i, x in enumerate(ms)], mask
            ),
            lambda t, ms=ms: [x.consume_token(t) for x in ms],
            ids,
        )
    return row


def _xgrammar(tok) -> LibRow:
    import xgrammar as xg

    row = LibRow(library="xgrammar", version=_version("xgrammar"))
    row.tokenizer_ms, info = _ms(lambda: xg.TokenizerInfo.from_huggingface(tok), 1)
    builds = {
        "json": lambda c: c.compile_json_schema(json.dumps(SCHEMA)),
        "regex": lambda c: c.compile_regex(REGEX),
        "choice": lambda c: c.compile_grammar('root ::= "COOPERATE" | "DEFECT"'),
    }
    compiled = {}
    for name, build in builds.items():
        fresh = lambda build=build: build(xg.GrammarCompiler(info, cache_enabled=False))  # noqa: E731
        row.compile_ms[name], compiled[name] = _ms(fresh)
    batch, ids = xg.BatchGrammarMatcher(), tok.encode(SAMPLES["json"], add_special_tokens=False)
    for n in (1, 16):
        ms = [xg.GrammarMatcher(compiled["json"]) for _ in range(n)]
        mask = xg.allocate_token_bitmask(n, info.vocab_size)
        row.mask_ms[f"x{n}"] = _masks(
            lambda _t, ms=ms, mask=mask: batch.batch_fill_next_token_bitmask(ms, mask),
            lambda t, ms=ms: [x.accept_token(t) for x in ms],
            ids,
        )
    return row


def _outlines(tok) -> LibRow:
    import torch
    from outlines_core import Guide, Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema

    row = LibRow(library="outlines-core", version=_version("outlines-core"))

    def vocabulary():
        words: dict[str, list[int]] = {}
        for t, i in tok.get_vocab().items():
            if i != tok.eos_token_id:
                words.setdefault(tok.convert_tokens_to_string([t]), []).append(i)
        return Vocabulary(tok.eos_token_id, words)

    row.tokenizer_ms, voc = _ms(vocabulary, 1)
    regexes = {"json": build_regex_from_schema(json.dumps(SCHEMA)), "regex": REGEX,
               "choice": "(COOPERATE|DEFECT)"}  # fmt: skip
    index = {}
    for name, rx in regexes.items():
        row.compile_ms[name], index[name] = _ms(lambda rx=rx: Index(rx, voc), 1)
    ids, width = tok.encode(SAMPLES["json"], add_special_tokens=False), (len(tok) + 31) // 32
    for n in (1, 16):
        guides = [Guide(index["json"]) for _ in range(n)]
        mask = torch.zeros((n, width), dtype=torch.int32)
        row.mask_ms[f"x{n}"] = _masks(
            lambda _t, gs=guides, mask=mask: [
                g.write_mask_into(mask[k].data_ptr(), width, 4) for k, g in enumerate(gs)
            ],
            lambda t, gs=guides: [g.advance(t) for g in gs],
            ids,
        )
    return row


def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "?"


def libraries(tok) -> list[LibRow]:
    """Each library that imports here, measured on `tok`; a failure is reported, not raised."""
    rows = []
    for name, probe in (("llguidance", _llguidance), ("xgrammar", _xgrammar),
                        ("outlines-core", _outlines)):  # fmt: skip
        try:
            rows.append(probe(tok))
        except ImportError:
            rows.append(LibRow(library=name, version="-", error="not installed"))
        except Exception as exc:  # a library that cannot run this case: say so, go on
            rows.append(LibRow(library=name, version=_version(name),
                               error=f"{type(exc).__name__}: {exc}"[:120]))  # fmt: skip
    return rows


# ---- the engine ----


async def throughput(engine, calls: int = 16, tokens: int = 64, runs: int = 3) -> Throughput:
    """`calls` decodes at once, free and constrained to LONG_TEXT, alternated."""
    q = await engine.prefill("Write a long story about a lighthouse keeper.")
    free, constrained = [], []
    for r in range(runs + 1):  # the first round warms up
        order = (False, True) if r % 2 == 0 else (True, False)
        for on in order:
            extra = dict(json_schema=LONG_TEXT) if on else dict(ignore_eos=True)
            reqs = [dict(parents=[q], max_tokens=tokens, temperature=1.0, seed=i, **extra)
                    for i in range(calls)]  # fmt: skip
            t0 = time.perf_counter()
            hs = await engine.decode_many(reqs)
            rate = sum(len(h.generated) for h in hs) / (time.perf_counter() - t0)
            for h in hs:
                engine.free(h)
            if r:
                (constrained if on else free).append(rate)
    engine.free(q)
    return Throughput(
        calls=calls,
        tokens=tokens,
        free_tok_s=free,
        constrained_tok_s=constrained,
        ratio=bootstrap(constrained, free),
    )


async def jumps(model: str, dtype: str) -> list[Jump]:
    """Forms the patterns use, greedy, decoded without and with jump-forward: the
    moderator's verdict (free reasoning inside fixed keys) and a player's decision
    (fixed keys around one choice)."""
    from corps.engine import Engine
    from corps.patterns.debate import MODERATOR
    from corps.patterns.prisoners_dilemma import DECIDE
    from corps.patterns.samples import QUESTION

    cases = {
        "debate verdict": (MODERATOR.format(question=QUESTION), forms.verdict(96)),
        "dilemma decision": (DECIDE, forms.decision(48)),
    }
    seen: dict[tuple[str, bool], tuple[str, int, int]] = {}
    for on in (False, True):
        async with Engine.open(model, dtype=dtype, jump_forward=on) as engine:
            for name, (prompt, form) in cases.items():
                sys = await engine.prefill(prompt, role="system")
                steps, jumped = engine.stats().steps, engine.stats().tokens_jumped
                h = await engine.decode(parents=[sys], **form)
                after = engine.stats()
                seen[name, on] = (h.text, after.steps - steps, after.tokens_jumped - jumped)
    return [
        Jump(
            form=name,
            steps_without=seen[name, False][1],
            steps_with=seen[name, True][1],
            tokens_jumped=seen[name, True][2],
            same_text=seen[name, False][0] == seen[name, True][0],
            text=seen[name, True][0],
        )
        for name in cases
    ]


async def pattern_errors(engine, rt, name: str, params: dict, seeds: int) -> PatternErrors:
    from corps.patterns.registry import run_pattern

    counts = {True: [], False: []}
    before = engine.stats()
    for seed in range(seeds):
        for on in (True, False):
            result = await run_pattern(rt, name, {**params, "seed": seed, "constrained": on})
            counts[on].append(len(result.parse_errors))
    after = engine.stats()
    return PatternErrors(
        pattern=name,
        seeds=seeds,
        errors_free=sum(counts[False]),
        errors_constrained=sum(counts[True]),
        runs_with_errors_free=sum(1 for n in counts[False] if n),
        runs_with_errors_constrained=sum(1 for n in counts[True] if n),
        constraints=after.constraints_compiled - before.constraints_compiled,
        compile_ms=(after.constraint_compile_s - before.constraint_compile_s) * 1e3,
    )


async def measure(
    model: str, dtype: str, *, seeds: int = 10, calls: int = 16, tokens: int = 64,
    runs: int = 3, patterns: list[str] | None = None, libs: bool = True,
) -> Report:  # fmt: skip
    from corps.agents import Runtime
    from corps.engine import Engine

    report = Report(model=model)
    async with Engine.open(model, dtype=dtype) as engine, Runtime(engine) as rt:
        if libs:
            report.libraries = libraries(engine.tokenizer)
        report.throughput = await throughput(engine, calls, tokens, runs)
        for name in patterns if patterns is not None else list(PATTERNS):
            report.patterns.append(await pattern_errors(engine, rt, name, PATTERNS[name], seeds))
    report.jumps = await jumps(model, dtype)
    return report


# ---- tables ----


def tables(report: Report) -> list:
    from rich.table import Table

    out = []
    if report.libraries:
        t = Table(title=f"constrained-decoding libraries on {report.model}'s tokenizer (ms)")
        for col in ("library", "version", "tokenizer", "compile json", "regex", "choice",
                    "mask json x1 /step", "x16 /step"):  # fmt: skip
            t.add_column(col, justify="left" if col in ("library", "version") else "right")
        for r in report.libraries:
            if r.error and not r.compile_ms:
                t.add_row(r.library, r.version, r.error, *[""] * 5)
                continue
            cells = [r.compile_ms.get(k) for k in ("json", "regex", "choice")]
            cells += [r.mask_ms.get(k) for k in ("x1", "x16")]
            t.add_row(r.library, r.version, _f(r.tokenizer_ms), *map(_f, cells))
            if r.error:
                t.add_row("", "", f"[yellow]{r.error}[/]", *[""] * 5)
        out.append(t)
    if report.throughput is not None:
        tp = report.throughput
        t = Table(title=f"{tp.calls} concurrent decodes x {tp.tokens} tokens: JSON schema vs free")
        for col in ("free tok/s", "constrained tok/s", "constrained / free [95%] (target >= 0.9)"):
            t.add_column(col, justify="right")
        r = tp.ratio
        t.add_row(f"{statistics.fmean(tp.free_tok_s):.1f}",
                  f"{statistics.fmean(tp.constrained_tok_s):.1f}",
                  f"{r.mean:.3f}x [{r.low:.3f}, {r.high:.3f}]")  # fmt: skip
        out.append(t)
    if report.jumps:
        t = Table(title="jump-forward: JSON forms of the patterns, greedy")
        for col in ("form", "steps without", "steps with", "fewer (target >= 1.5x)",
                    "jumped tokens", "same text"):  # fmt: skip
            t.add_column(col, justify="left" if col == "form" else "right")
        for j in report.jumps:
            t.add_row(j.form, str(j.steps_without), str(j.steps_with),
                      f"{j.steps_without / max(1, j.steps_with):.2f}x", str(j.tokens_jumped),
                      "yes" if j.same_text else "NO")  # fmt: skip
        out.append(t)
    if report.patterns:
        t = Table(title="parse errors over seeds (constrained = 0 is the target)")
        for col in ("pattern", "seeds", "errors free", "runs with errors free",
                    "errors constrained", "runs with errors constrained", "constraints",
                    "compile ms"):  # fmt: skip
            t.add_column(col, justify="left" if col == "pattern" else "right")
        for p in report.patterns:
            t.add_row(p.pattern, str(p.seeds), str(p.errors_free), str(p.runs_with_errors_free),
                      str(p.errors_constrained), str(p.runs_with_errors_constrained),
                      str(p.constraints), f"{p.compile_ms:.1f}")  # fmt: skip
        out.append(t)
    return out


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}" if x < 10 else f"{x:.0f}"
