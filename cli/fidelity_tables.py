"""The tables and plots `corps fidelity` and `corps eval` print: fidelity per
configuration, the audit-rate curve, what each configuration cost."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.table import Table

from corps.cli.eval_options import (
    num,
    out,
)


def fidelity_table(title: str, rows: Sequence[Any]) -> None:
    t = Table(title=title, title_justify="left")
    for col in ("role", "turns", "tokens", "base", "replay", "gap", "agree", "diverged",
                "1st div"):  # fmt: skip
        t.add_column(col, justify="left" if col == "role" else "right")
    for r in rows:
        t.add_row(
            r.role, str(r.turns), str(r.tokens), num(r.baseline_loss), num(r.replay_loss),
            num(r.gap, 4), num(r.agreement), f"{r.diverged}/{r.turns}", num(r.first_divergence, 1),
            end_section=r.role == rows[-2].role if len(rows) > 1 else False,
        )  # fmt: skip
    out.print(t)
    out.print(
        "[dim]base / replay: log-loss per token (nats) of the baseline's tokens; gap = replay "
        "- base; agree: share of positions whose argmax is the same; 1st div: mean position "
        "of a turn's first differing argmax[/]"
    )


def curve_table(title: str, report: Any) -> None:
    """One row per replay: its overall gap, how much of the first replay's gap it
    closes, agreement, the context it recomputed, and its cost against the first
    replay's and the baseline's."""
    tables = report.tables()
    first = next(iter(tables))
    ref, ref_ttft = tables[first][-1].gap, tables[first][-1].ttft
    t = Table(title=title, title_justify="left")
    short = _short(first)
    for col in ("replay", "gap", "closes", "agree", "recomputed", "of baseline's work",
                "over: calls / workflows", "encoded / baseline", "TTFT ms", "TTFT / " + short,
                "TTFT / baseline", "wall / " + short, "wall / baseline"):  # fmt: skip
        first_col = col == "replay"  # a label is never cut: it wraps
        t.add_column(col, justify="left" if first_col else "right", overflow="fold",
                     min_width=14 if first_col else None)  # fmt: skip
    wall = report.wall
    for label, rows in tables.items():
        r = rows[-1]
        closes = 1 - r.gap / ref if ref and not math.isnan(ref) else math.nan
        work, wf_over = report.work(label)
        t.add_row(
            _short(label), num(r.gap, 4), f"{closes:.0%}" if not math.isnan(closes) else "-",
            num(r.agreement), f"{r.recomputed:.0%}",
            "-" if math.isnan(r.of_baseline) else f"{r.of_baseline:.0%}",
            f"{r.calls_over}/{r.turns} · {wf_over}/{len(report.pairs[label])}",
            "-" if math.isnan(work) else f"{work:.2f}",
            num(r.ttft and r.ttft * 1000, 1),
            _ratio(r.ttft, ref_ttft), _ratio(r.ttft, r.baseline_ttft),
            _ratio(wall.get(label), wall.get(first)),
            _ratio(wall.get(label), wall.get("baseline")),
        )  # fmt: skip
    out.print(t)
    out.print(
        f"[dim]closes: share of {first}'s gap removed; recomputed: share of the reused "
        "context tokens recomputed instead; of baseline's work: the tokens recomputed as a "
        "share of the context tokens the baseline encoded for the same turns (100%: nothing "
        "saved); over: the calls whose recompute exceeded the baseline's context work for "
        "the same call, and the workflows that encoded more tokens in all than the "
        "baseline's; encoded / baseline: every call's tokens encoded (prefills, decodes, "
        "repairs), over every workflow; TTFT: mean over the replay's turns (the "
        "baseline's: over the same turns as it sampled them); wall: each replay over every "
        "input, alone (the baseline: its sampling)[/]"
    )


def _short(label: str) -> str:
    """A replay's label in the curve: its repair policy, or what else it is (a bare
    "choreographed": the engine's defaults, the decision steps repaired)."""
    if label == "choreographed":
        return "default"
    return label.removeprefix("choreographed@")


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "-"


def plot_curve(report: Any, path: Path, title: str) -> None:
    """Each replay as a point: overall gap against mean TTFT, labelled."""
    points = [(label, rows[-1].ttft, rows[-1].gap) for label, rows in report.tables().items()]
    plot_points(points, path, title, "log-loss gap vs baseline (nats/token)", zero=True)


def plot_points(
    points: list[tuple[str, float | None, float | None]],
    path: Path,
    title: str,
    ylabel: str,
    *,
    zero: bool = False,
) -> None:
    """Each (label, mean TTFT s, y) as a labelled point (those without both left out)."""
    from corps.bench.plotting import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for label, ttft, y in points:
        if ttft is None or y is None:
            continue
        ax.scatter([ttft * 1000], [y])
        at = (ttft * 1000, y)
        ax.annotate(_short(label), at, textcoords="offset points", xytext=(4, 4), fontsize=8)
    if zero:
        ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.set_xlabel("mean TTFT (ms)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def eval_costs(title: str, results: list[Any]) -> None:
    """One row per configuration: the context it recomputed (of what it reused, and of
    the baseline's own work when a baseline ran), its mean TTFT and wall time, against
    the first configuration's."""
    first = results[0]
    base = next((s for s in results if s.label == "baseline"), None)
    t = Table(title=title, title_justify="left")
    for col in ("configuration", "recomputed", "of baseline's work", "runs over baseline",
                "TTFT ms", "TTFT / first", "wall s", "wall / first"):  # fmt: skip
        first_col = col == "configuration"
        t.add_column(col, justify="left" if first_col else "right", overflow="fold",
                     min_width=22 if first_col else None)  # fmt: skip
    for s in results:
        share = "-" if base is None or s is base else f"{s.share_of(base):.0%}"
        runs = "-" if base is None or s is base else "{}/{}".format(*s.over(base))
        t.add_row(
            s.label, f"{s.recomputed:.0%}", share, runs, num(s.ttft and s.ttft * 1000, 1),
            _ratio(s.ttft, first.ttft), f"{s.wall_s:.1f}", _ratio(s.wall_s, first.wall_s),
        )  # fmt: skip
    out.print(t)
    out.print(
        "[dim]recomputed: share of the context tokens the calls reused that they "
        "recomputed instead; of baseline's work: the tokens recomputed (and encoded by "
        "audits) as a share of the context tokens the baseline encoded for the same "
        "inputs (100%: nothing saved); runs over baseline: the inputs whose run encoded "
        "more tokens in all than the baseline's run of the same input (each sampling its "
        "own replies); TTFT: mean over the runs of each run's mean; wall: "
        "the pass over every input, after one untimed run of the first[/]"
    )
