"""What `corps run` prints of a result: the pattern's view of it, the engine's summary
(tokens, time to first token, repairs, leaks), one line per run of many."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from corps.cli.options import one_line
from corps.cli.scenario import Target
from corps.patterns.result import PatternResult

out = Console()


@dataclass(frozen=True)
class Summary:
    """A run's figures from the engine's own counters (what a workflow of one's own
    gets without filling a `PatternResult`)."""

    tokens_encoded: int
    tokens_reused: int
    mean_ttft_s: float
    wall_s: float
    leaks: int
    leak_notes: tuple[str, ...] = ()  # the first few leaks, explained (ids, never text)

    @classmethod
    def of(cls, engine: Any, wall_s: float) -> Summary:
        stats = engine.stats()
        notes = dict.fromkeys(e.detail for e in engine.access_events() if e.kind == "leak")
        return cls(stats.tokens_encoded, stats.tokens_reused, stats.mean_ttft_s, wall_s,
                   stats.leaks, tuple(notes)[:LEAK_NOTES])  # fmt: skip


#: Leaks explained under a run's table (the rest are counted; --trace keeps each).
LEAK_NOTES = 3


def say_leaks(summary: Summary | None) -> None:
    """Under warn: each leak's reader, message and the hidden message its encoding
    attended to, and the two fixes."""
    if summary is None or not summary.leaks:
        return
    out.print(
        f"  {summary.leaks} leak(s): a call read encodings built over messages its agent "
        "may not see:",
        highlight=False,
    )
    for note in summary.leak_notes:
        out.print(f"  - {note}", highlight=False)
    more = summary.leaks - len(summary.leak_notes)
    if more > 0:
        out.print(f"  - and {more} more (--trace FILE keeps each)", highlight=False)
    out.print(
        "  fix: make the hidden message public if the reader may see it (visibility=Public(); "
        "an agent's system prompt: system_visibility='public'), or --leak-policy reencode "
        "(encodes it again for the reader; docs/agents.md)",
        highlight=False,
    )


def show(result: Any, tgt: Target, summary: Summary | None = None) -> None:
    if not isinstance(result, PatternResult):
        show_summary(result, tgt, summary)
        return
    out.print(f"[bold]answer:[/] {result.answer}", highlight=False)
    table = Table(title=f"{result.pattern} ({result.mode})")
    for col in (
        "calls",
        "tokens encoded",
        "tokens reused",
        "mean TTFT",
        "wall",
        "leaks",
        "parse errors",
    ):
        table.add_column(col, justify="right")
    ttft = "-" if result.mean_ttft_s is None else f"{result.mean_ttft_s * 1000:.0f} ms"
    table.add_row(
        str(result.calls),
        str(result.tokens_encoded),
        str(result.tokens_reused),
        ttft,
        f"{result.wall_s:.1f} s",
        str(result.leaks),
        str(len(result.parse_errors)),
    )
    out.print(table)
    repaired = sum(h.tokens_repaired for h in result.messages)
    cut = sum(h.tokens_repair_cut for h in result.messages)
    if repaired or cut:  # a repair's rows are among the tokens encoded: say how many
        capped = f"; {cut} more cut: the baseline would not encode them" if cut else ""
        out.print(
            f"  {repaired} of the tokens encoded recomputed rewired context{capped} "
            "(--repair / --decision-repair; docs/fidelity.md)",
            highlight=False,
        )
    for e in result.parse_errors[:5]:
        out.print(f"  parse error: {e}", highlight=False)
    say_leaks(summary)


def show_summary(result: Any, tgt: Target, summary: Summary | None) -> None:
    """A workflow's own result, then the engine's figures of the run, leaks said."""
    out.print("[bold]answer:[/] ", end="")
    out.print(result, highlight=False)
    if summary is None:
        return
    table = Table(title=f"{Path(tgt.label).name}")
    for col in ("tokens encoded", "tokens reused", "mean TTFT", "wall", "leaks"):
        table.add_column(col, justify="right")
    ttft = "-" if math.isnan(summary.mean_ttft_s) else f"{summary.mean_ttft_s * 1000:.0f} ms"
    table.add_row(str(summary.tokens_encoded), str(summary.tokens_reused), ttft,
                  f"{summary.wall_s:.1f} s", str(summary.leaks))  # fmt: skip
    out.print(table)
    say_leaks(summary)


def show_many(results: list[Any], tgt: Target) -> None:
    done = [r for r in results if isinstance(r, PatternResult)]
    table = Table(title=f"{len(results)} runs of {tgt.label}")
    for col in (
        "runs ok",
        "failed",
        "tokens encoded",
        "tokens reused",
        "mean TTFT",
        "parse errors",
        "leaks",
    ):
        table.add_column(col, justify="right")
    ttfts = [r.mean_ttft_s for r in done if r.mean_ttft_s is not None]
    ttft = f"{sum(ttfts) / len(ttfts) * 1000:.0f} ms" if ttfts else "-"
    table.add_row(
        str(len(done)),
        str(len(results) - len(done)),
        str(sum(r.tokens_encoded for r in done)),
        str(sum(r.tokens_reused for r in done)),
        ttft,
        str(sum(len(r.parse_errors) for r in done)),
        str(sum(r.leaks for r in done)),
    )
    out.print(table)
    for i, r in enumerate(results):
        if isinstance(r, Exception):
            out.print(f"  run {i + 1} failed: {one_line(r)}", highlight=False)
