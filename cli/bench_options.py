"""What the `corps bench` commands share: option parsing, reports, running a benchmark."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from rich.console import Console

from corps.cache.errors import CorpsError
from corps.cli.options import bad as _bad
from corps.cli.options import (
    fail,
)

T = TypeVar("T")

#: The largest count `--streams` and its kind take (more would only exhaust memory).
MAX_COUNT = 4096

#: `corps bench gpu --workflows` (corps.bench.gpu_figures.WORKFLOWS, named here without torch)
GPU_WORKFLOWS = ("debate", "tree_of_thoughts", "parallel_debate", "tree_of_thoughts_8x8")
#: `corps bench gpu --sections` (corps.bench.gpu_figures.SECTIONS)
GPU_SECTIONS = (
    "prefill", "decode", "streams", "profile", "graphs", "patterns", "memory", "workflows",
    "account",
)  # fmt: skip


def stream_counts(streams: str, option: str = "--streams") -> list[int]:
    """`--streams` (or another such `option`) as counts >= 1 (bad input: one line,
    exit 2)."""
    try:
        counts = [int(x) for x in streams.split(",") if x.strip()]
    except ValueError:
        _bad(f"{option} takes comma-separated counts like 1,4,16, got {streams!r}")
    if not counts or min(counts) < 1 or max(counts) > MAX_COUNT:
        _bad(f"{option} takes counts from 1 to {MAX_COUNT}, got {streams!r}")
    return counts


def pattern_names(patterns: str | None, choices: Iterable[str] | None = None) -> tuple[str, ...]:
    """--patterns: the patterns named among `choices` (default: every built-in one), all
    of them when None; unknown names, or none, refused."""
    from corps.patterns.registry import PATTERNS

    choices = tuple(PATTERNS if choices is None else choices)
    if patterns is None:
        return choices
    names = tuple(p.strip().replace("-", "_") for p in patterns.split(",") if p.strip())
    unknown = sorted(set(names) - set(choices))
    if unknown or not names:
        _bad(f"--patterns: unknown {', '.join(unknown) or '(none given)'}; "
             f"choose from {', '.join(choices)}")  # fmt: skip
    return names


def bench_args(pattern: str, set_: list[str] | None, impls: str):
    from corps.cli.scenario import parse_sets
    from corps.patterns import registry

    chosen = tuple(i.strip() for i in impls.split(",") if i.strip())
    bad = [i for i in chosen if i not in ("baseline", "choreographed", "hf")]
    if bad or "baseline" not in chosen or "choreographed" not in chosen:
        _bad(f"--impls takes baseline,choreographed and optionally hf, got {impls!r}")
    try:
        params = parse_sets(set_ or [])
        registry.validate(registry.get(pattern), params)
    except CorpsError as exc:
        _bad(str(exc))
    return params, chosen


def print_report(report: Any, tables: list[Any], json_out: str | None, width: int = 120) -> None:
    """Print a benchmark's tables (at least `width` columns wide); its JSON to `json_out`."""
    console = Console(width=max(width, Console().width))
    for table in tables:
        console.print(table)
    if json_out is not None:
        with open(json_out, "w") as f:
            f.write(report.model_dump_json(indent=2))


def run_bench(work: Callable[[], Awaitable[T]]) -> T:
    """Run a benchmark's coroutine: the patterns' own leak warnings silenced (they are
    counted), a corps error printed as one line (exit 1), raised alone or from inside a
    task group of concurrent workflows."""
    import warnings

    import anyio

    from corps.cache.visibility import LeakWarning

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", LeakWarning)
            return anyio.run(work)
    except (CorpsError, BaseExceptionGroup) as exc:
        err: BaseException = exc
        while isinstance(err, BaseExceptionGroup) and len(err.exceptions) == 1:
            err = err.exceptions[0]
        if not isinstance(err, CorpsError):
            raise
        fail(err)


def measure_pattern(
    bw, pattern, params, chosen, runs, warmup, model, dtype, questions, repair="none"
):
    return run_bench(
        lambda: bw.measure(
            pattern,
            params,
            model=model,
            impls=chosen,
            runs=runs,
            warmup=warmup,
            dtype=dtype,
            questions=questions,
            repair=repair,
        )
    )


def write_reports(bw, reports, json_out: str | None, plot_out: str | None) -> None:
    if json_out:
        with open(json_out, "w") as f:
            f.write("[" + ",\n".join(r.model_dump_json() for r in reports) + "]\n")
    if plot_out:
        try:
            bw.plot(reports, plot_out)
        except RuntimeError as exc:
            fail(CorpsError(str(exc)))
