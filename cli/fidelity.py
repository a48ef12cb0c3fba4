"""`corps fidelity`, `corps eval`, `corps distill` and `corps inputs`: what choreography
changes in a workflow, its task score per configuration, and the LoRA that repairs it."""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Annotated, Any

import anyio
import typer
from rich.table import Table

from corps.cache.errors import CorpsError
from corps.cli.eval_options import (
    Concurrency,
    Dtype,
    Inputs,
    Json,
    Model,
    Pattern,
    Seed,
    Sets,
    config_of,
    err,
    exit_with,
    input_lines,
    num,
    out,
    progress,
    quiet,
    repairs_of,
    runtimes,
)
from corps.cli.fidelity_tables import (
    curve_table,
    eval_costs,
    fidelity_table,
    plot_curve,
    plot_points,
)
from corps.cli.options import AuditBudgetOpt, AuditOpt, DecisionRepairOpt
from corps.engine.config import DEFAULT_MODEL, BadConfig
from corps.engine.model.adapter_files import check_adapter_of
from corps.patterns import registry

# ---- corps fidelity ----


def fidelity(
    pattern: Pattern,
    inputs: Inputs = None,
    n: Annotated[int | None, typer.Option(min=1, help="Runs (default: every line, or 8).")] = None,
    set_: Sets = None,
    seed: Seed = 0,
    adapter: Annotated[
        Path | None,
        typer.Option(help="Also replay with this LoRA adapter (choreographed and baseline)."),
    ] = None,
    repair: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated repair policies to replay choreographed with, each a "
            "point of the fidelity-vs-cost curve: none, first:K, recompute:R, full, temp:T, "
            "serial, A+B (e.g. none,first:4,recompute:0.15,full,serial+full)."
        ),
    ] = None,
    plot: Annotated[
        Path | None,
        typer.Option("--plot", help="PNG: each replay's gap against its mean TTFT (matplotlib)."),
    ] = None,
    model: Model = DEFAULT_MODEL,
    dtype: Dtype = "float32",
    concurrency: Concurrency = 4,
    json_out: Json = None,
    decision_repair: DecisionRepairOpt = None,
) -> None:
    """How much choreography changes a workflow: sample baseline runs at temperature 1,
    replay each choreographed with every decode forced to the baseline's tokens, and
    compare how the two score those tokens, per role. With --repair, one replay per
    repair policy, and a curve of gap against cost (recomputed tokens, TTFT, wall)."""
    from corps.patterns.evaluation import fidelity as fid

    try:
        lines = input_lines(pattern, inputs, set_, n)
        base = config_of(model, "baseline", dtype)
        labels = repairs_of(repair) or ["choreographed"]
        configs = {label: config_of(model, label, dtype, decision_repair) for label in labels}
        if adapter is not None:  # labelled "+adapter": the directory is printed once
            for mode, plain in (("choreographed", "@none"), ("baseline", "")):
                configs[f"{mode}+adapter"] = config_of(model, f"{mode}+{adapter}{plain}", dtype)
        labels = list(configs)
        for cfg in configs.values():
            check_adapter_of(cfg, err)
    except BadConfig as exc:
        exit_with(exc.for_cli())
    except CorpsError as exc:
        exit_with(str(exc))
    name = registry.canonical(pattern)
    seeds = [seed + i for i in range(len(lines))]

    async def main() -> Any:
        async with AsyncExitStack() as stack:
            rts = await runtimes(stack, {"baseline": base, **configs})
            total = len(lines) * (1 + len(labels))
            with progress(total, f"{name}: baseline runs, then each replay") as bar:
                task = bar.add_task("", total=total)
                replays = {label: rts[label] for label in labels}
                return await fid.measure(
                    rts["baseline"], replays, name, lines, seeds, concurrency=concurrency,
                    on_done=lambda: bar.advance(task),
                )  # fmt: skip

    with quiet():
        try:
            report = anyio.run(main)
        except CorpsError as exc:
            exit_with(str(exc), 1)
    tables = report.tables()
    for label, rows in tables.items():
        fidelity_table(f"{name}: baseline vs {label} ({len(lines)} runs, {dtype})", rows)
    if len(tables) > 1:
        curve_table(f"{name}: fidelity against cost ({len(lines)} runs, {dtype})", report)
    if plot is not None:
        plot_curve(report, plot, f"{name}, {len(lines)} runs")
    if adapter is not None:
        out.print(f"adapter: {adapter}")
    for i, why in report.failed:
        err.print(f"run {i}: {why}", highlight=False)
    if json_out is not None:
        json_out.write_text(json.dumps(report.as_dict(), indent=2) + "\n")
    if report.failed:
        raise typer.Exit(1)


# ---- corps eval ----


def evaluate(
    pattern: Pattern,
    inputs: Annotated[Path, typer.Option(help="JSON lines with the references to score against.")],
    configs: Annotated[
        str,
        typer.Option(
            help="Comma-separated: baseline, choreographed, choreographed+ADAPTER_DIR, "
            "choreographed@REPAIR (a repair policy, e.g. choreographed@recompute:0.15)."
        ),
    ] = "baseline,choreographed",
    repair: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated repair policies: one choreographed configuration each, "
            "after --configs (none, first:K, recompute:R, full, temp:T, serial, A+B)."
        ),
    ] = None,
    n: Annotated[int | None, typer.Option(min=1, help="Only the first N lines.")] = None,
    set_: Sets = None,
    seed: Seed = 0,
    model: Model = DEFAULT_MODEL,
    dtype: Annotated[str, typer.Option(help="Engine precision (auto by default).")] = "auto",
    concurrency: Concurrency = 8,
    json_out: Json = None,
    plot: Annotated[
        Path | None,
        typer.Option("--plot", help="PNG: each configuration's score against its mean TTFT."),
    ] = None,
    audit: AuditOpt = 0,
    audit_budget: AuditBudgetOpt = 0.05,
    decision_repair: DecisionRepairOpt = None,
) -> None:
    """The workflow's task score per configuration on the same inputs and seeds, with
    paired significance against the first (McNemar for right/wrong, bootstrap otherwise),
    and what each cost: the share of the context its calls recomputed (a repair), mean
    TTFT and wall time, against the first's."""
    from corps.patterns.evaluation import evaluate as ev
    from corps.patterns.evaluation.scoring import scorer

    try:
        name = registry.canonical(pattern)
        scorer(name)
        lines = input_lines(pattern, inputs, set_, n)
        labels = [c.strip() for c in configs.split(",") if c.strip()]
        labels += [label for label in repairs_of(repair) if label not in labels]
        if len(labels) < 1 or len(set(labels)) != len(labels):
            raise BadConfig(f"--configs: give distinct configurations, got {configs!r}")
        cfgs = {
            label: config_of(
                model, label, dtype, decision_repair, audit=audit, audit_budget=audit_budget
            )
            for label in labels
        }
        for cfg in cfgs.values():
            check_adapter_of(cfg, err)
    except BadConfig as exc:
        exit_with(exc.for_cli())
    except CorpsError as exc:
        exit_with(str(exc))
    seeds = [seed + i for i in range(len(lines))]

    async def main() -> list[Any]:
        from corps.agents import Runtime
        from corps.engine import Engine

        got = []
        for label, cfg in cfgs.items():  # one engine at a time
            async with Engine.open(cfg) as engine, Runtime(engine) as rt:
                with progress(len(lines), f"{name} · {label}") as bar:
                    task = bar.add_task("", total=len(lines))
                    got.append(await ev.scores(
                        rt, label, name, lines, seeds, concurrency=concurrency,
                        on_done=lambda t=task: bar.advance(t),
                    ))  # fmt: skip
        return got

    with quiet():
        try:
            results = anyio.run(main)
        except CorpsError as exc:
            exit_with(str(exc), 1)
    t = Table(title=f"{name}: task score, {len(lines)} inputs", title_justify="left")
    for col in ("configuration", "score", "scored", "vs " + labels[0], "p", "significant"):
        first_col = col == "configuration"  # a label is never cut: it wraps
        t.add_column(col, justify="left" if first_col else "right", overflow="fold",
                     min_width=22 if first_col else None)  # fmt: skip
    report: dict[str, Any] = dict(pattern=name, inputs=len(lines), configs={})
    for s in results:
        row = dict(score=s.mean, scored=sum(x is not None for x in s.scores), errors=s.errors,
                   scores=s.scores, mean_ttft_s=s.ttft, wall_s=s.wall_s,
                   tokens_reused=s.reused, tokens_repaired=s.repaired,
                   tokens_encoded=s.encoded, tokens_generated=s.generated,
                   audit_tokens=s.audit_tokens, recomputed=s.recomputed)  # fmt: skip
        cells = ["", "", ""]
        if s is not results[0]:
            c = ev.compare(results[0], s)
            row["vs_first"] = dict(test=c.test, p=c.p, **c.detail)
            extra = (f"{c.detail['only_a']} / {c.detail['only_b']} only"
                     if c.test == "mcnemar" else f"{c.detail['mean_diff']:+.3f}")  # fmt: skip
            cells = [extra, f"{c.p:.3g}", "yes" if c.significant else "no"]
        report["configs"][s.label] = row
        t.add_row(s.label, num(s.mean), f"{row['scored']}/{len(lines)}", *cells)
    out.print(t)
    base = next((s for s in results if s.label == "baseline"), None)
    for s in results:
        if base is not None and s is not base:
            report["configs"][s.label]["of_baseline_work"] = s.share_of(base)
            over, both = s.over(base)
            report["configs"][s.label]["workflows_over_baseline"] = dict(over=over, of=both)
    eval_costs(f"{name}: what each configuration cost", results)
    for s in results:
        for i, why in sorted(s.errors.items())[:5]:
            err.print(f"{s.label} run {i}: {why}", highlight=False)
    if json_out is not None:
        json_out.write_text(json.dumps(report, indent=2) + "\n")
    if plot is not None:
        plot_points(
            [(s.label, s.ttft, s.mean) for s in results], plot,
            f"{name}, {len(lines)} inputs", "task score",
        )  # fmt: skip


# ---- corps distill ----


# ---- corps inputs ----
