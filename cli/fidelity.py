"""`corps fidelity`, `corps eval`, `corps distill` and `corps inputs`: what choreography
changes in a workflow, its task score per configuration, and the LoRA that repairs it."""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterator, Sequence
from contextlib import AsyncExitStack, contextmanager
from pathlib import Path
from typing import Annotated, Any

import anyio
import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from corps.cache.errors import CorpsError
from corps.cache.visibility import LeakWarning
from corps.cli.options import AuditBudgetOpt, AuditOpt, DecisionRepairOpt, repair_fields
from corps.cli.run import read_inputs
from corps.cli.scenario import parse_sets
from corps.engine.config import DEFAULT_MODEL, BadConfig, EngineConfig
from corps.engine.model.adapter_files import check_adapter_of
from corps.patterns import registry
from corps.patterns.evaluation.scoring import split_line

out = Console()
err = Console(stderr=True)

Pattern = Annotated[str, typer.Argument(help="A built-in pattern (corps scenarios lists them).")]
Inputs = Annotated[
    Path | None,
    typer.Option(
        help="JSON lines, one object of pattern inputs per run (corps inputs makes some)."
    ),
]
Sets = Annotated[
    list[str] | None, typer.Option("--set", help="key=value for every run (repeatable).")
]
Model = Annotated[str, typer.Option("--model", "-m", help="Alias, HF dir or hub id.")]
Seed = Annotated[int, typer.Option(help="Run i uses seed SEED + i.")]
Concurrency = Annotated[int, typer.Option(min=1, help="Workflows at a time per engine.")]
Json = Annotated[Path | None, typer.Option("--json", help="Write the figures here.")]
Dtype = Annotated[
    str,
    typer.Option(
        help="Engine precision; float32 (default here) is exact, so a gap is choreography's."
    ),
]


def _exit(message: str, code: int = 2) -> None:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


def _lines(pattern: str, inputs: Path | None, sets: list[str] | None, n: int | None) -> list[dict]:
    """The input lines (each checked against the pattern), at most n; without
    --inputs, n copies of the pattern's defaults (the seeds make them differ)."""
    fn = registry.get(pattern)
    common = parse_sets(sets or [])
    lines = read_inputs(inputs) if inputs is not None else [{}] * (n or 8)
    lines = [{**common, **line} for line in lines[: n or None]]
    for i, line in enumerate(lines):
        registry.validate(fn, split_line(line)[0], f"line {i + 1}: ")
    return lines


def _config(
    model: str, label: str, dtype: str, decision: str | None = None, **kw: Any
) -> EngineConfig:
    """'baseline', 'choreographed', either '+ADAPTER_DIR', and a choreographed one
    '@REPAIR' (a repair policy: choreographed@recompute:0.15, for every call: the
    decision steps' default repair is off, but '@auto' starts them at its rung;
    bare 'choreographed' keeps it). A named policy other than auto runs uncapped
    by the baseline's work (`repair_bound=False`): what is measured is the policy's
    own reach and cost. `decision` (--decision-repair): the decision steps' repair
    of the bare and '@auto' configurations, else the default."""
    rest, _, repair = label.partition("@")
    mode, _, adapter = rest.partition("+")
    if mode not in ("baseline", "choreographed") or (repair and mode != "choreographed"):
        raise BadConfig(
            "a configuration is baseline[+ADAPTER_DIR] or choreographed[+ADAPTER_DIR]"
            f"[@REPAIR], got {label!r}"
        )
    named = repair_fields(repair or None, decision)  # the rule --repair follows in run
    if repair and repair.strip().lower().partition(":")[0] != "auto":
        kw.setdefault("repair_bound", False)  # the policy's own reach
    return EngineConfig.of(model, mode=mode, dtype=dtype, adapter=adapter or None, **named, **kw)


def _repairs(repair: str | None) -> list[str]:
    """The configurations of `--repair a,b,...`: choreographed, repaired by each
    policy on every call ("choreographed@none": plain choreography, the decision
    steps' default off), in the order given."""
    from corps.engine.repair import parse_repair

    labels = []
    for part in (repair or "").split(","):
        if part.strip():
            policy = str(parse_repair(part))
            labels.append(f"choreographed@{policy}")
    if len(set(labels)) != len(labels):
        raise BadConfig(f"--repair: give distinct policies, got {repair!r}")
    return labels


def _progress(total: int, what: str) -> Progress:
    return Progress(
        TextColumn(what), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TimeRemainingColumn(), console=err, transient=True,
    )  # fmt: skip


async def _runtimes(stack: AsyncExitStack, configs: dict[str, EngineConfig]) -> dict[str, Any]:
    from corps.agents import Runtime
    from corps.engine import Engine

    rts = {}
    for label, cfg in configs.items():
        engine = await stack.enter_async_context(Engine.open(cfg))
        rts[label] = await stack.enter_async_context(Runtime(engine))
    return rts


@contextmanager
def _quiet() -> Iterator[None]:
    """Leaks are counted, not warned about; peft's deprecation notice is not ours."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LeakWarning)
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated")
        yield


def _f(x: float | None, digits: int = 3) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


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
        lines = _lines(pattern, inputs, set_, n)
        base = _config(model, "baseline", dtype)
        labels = _repairs(repair) or ["choreographed"]
        configs = {label: _config(model, label, dtype, decision_repair) for label in labels}
        if adapter is not None:  # labelled "+adapter": the directory is printed once
            for mode, plain in (("choreographed", "@none"), ("baseline", "")):
                configs[f"{mode}+adapter"] = _config(model, f"{mode}+{adapter}{plain}", dtype)
        labels = list(configs)
        for cfg in configs.values():
            check_adapter_of(cfg, err)
    except BadConfig as exc:
        _exit(exc.for_cli())
    except CorpsError as exc:
        _exit(str(exc))
    name = registry.canonical(pattern)
    seeds = [seed + i for i in range(len(lines))]

    async def main() -> Any:
        async with AsyncExitStack() as stack:
            rts = await _runtimes(stack, {"baseline": base, **configs})
            total = len(lines) * (1 + len(labels))
            with _progress(total, f"{name}: baseline runs, then each replay") as bar:
                task = bar.add_task("", total=total)
                replays = {label: rts[label] for label in labels}
                return await fid.measure(
                    rts["baseline"], replays, name, lines, seeds, concurrency=concurrency,
                    on_done=lambda: bar.advance(task),
                )  # fmt: skip

    with _quiet():
        try:
            report = anyio.run(main)
        except CorpsError as exc:
            _exit(str(exc), 1)
    tables = report.tables()
    for label, rows in tables.items():
        _fidelity_table(f"{name}: baseline vs {label} ({len(lines)} runs, {dtype})", rows)
    if len(tables) > 1:
        _curve_table(f"{name}: fidelity against cost ({len(lines)} runs, {dtype})", report)
    if plot is not None:
        _plot_curve(report, plot, f"{name}, {len(lines)} runs")
    if adapter is not None:
        out.print(f"adapter: {adapter}")
    for i, why in report.failed:
        err.print(f"run {i}: {why}", highlight=False)
    if json_out is not None:
        json_out.write_text(json.dumps(report.as_dict(), indent=2) + "\n")
    if report.failed:
        raise typer.Exit(1)


def _fidelity_table(title: str, rows: Sequence[Any]) -> None:
    t = Table(title=title, title_justify="left")
    for col in ("role", "turns", "tokens", "base", "replay", "gap", "agree", "diverged",
                "1st div"):  # fmt: skip
        t.add_column(col, justify="left" if col == "role" else "right")
    for r in rows:
        t.add_row(
            r.role, str(r.turns), str(r.tokens), _f(r.baseline_loss), _f(r.replay_loss),
            _f(r.gap, 4), _f(r.agreement), f"{r.diverged}/{r.turns}", _f(r.first_divergence, 1),
            end_section=r.role == rows[-2].role if len(rows) > 1 else False,
        )  # fmt: skip
    out.print(t)
    out.print(
        "[dim]base / replay: log-loss per token (nats) of the baseline's tokens; gap = replay "
        "- base; agree: share of positions whose argmax is the same; 1st div: mean position "
        "of a turn's first differing argmax[/]"
    )


def _curve_table(title: str, report: Any) -> None:
    """One row per replay: its overall gap, how much of the first replay's gap it
    closes, agreement, the context it recomputed, and its cost against the first
    replay's and the baseline's."""
    tables = report.tables()
    first = next(iter(tables))
    ref, ref_ttft = tables[first][-1].gap, tables[first][-1].ttft
    t = Table(title=title, title_justify="left")
    short = _short(first)
    for col in ("replay", "gap", "closes", "agree", "recomputed", "of baseline's work",
                "TTFT ms", "TTFT / " + short, "TTFT / baseline", "wall / " + short,
                "wall / baseline"):  # fmt: skip
        first_col = col == "replay"  # a label is never cut: it wraps
        t.add_column(col, justify="left" if first_col else "right", overflow="fold",
                     min_width=14 if first_col else None)  # fmt: skip
    wall = report.wall
    for label, rows in tables.items():
        r = rows[-1]
        closes = 1 - r.gap / ref if ref and not math.isnan(ref) else math.nan
        t.add_row(
            _short(label), _f(r.gap, 4), f"{closes:.0%}" if not math.isnan(closes) else "-",
            _f(r.agreement), f"{r.recomputed:.0%}",
            "-" if math.isnan(r.of_baseline) else f"{r.of_baseline:.0%}",
            _f(r.ttft and r.ttft * 1000, 1),
            _ratio(r.ttft, ref_ttft), _ratio(r.ttft, r.baseline_ttft),
            _ratio(wall.get(label), wall.get(first)),
            _ratio(wall.get(label), wall.get("baseline")),
        )  # fmt: skip
    out.print(t)
    out.print(
        f"[dim]closes: share of {first}'s gap removed; recomputed: share of the reused "
        "context tokens recomputed instead; of baseline's work: the tokens recomputed as a "
        "share of the context tokens the baseline encoded for the same turns (100%: nothing "
        "saved); TTFT: mean over the replay's turns (the "
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


def _plot_curve(report: Any, path: Path, title: str) -> None:
    """Each replay as a point: overall gap against mean TTFT, labelled."""
    points = [(label, rows[-1].ttft, rows[-1].gap) for label, rows in report.tables().items()]
    _plot_points(points, path, title, "log-loss gap vs baseline (nats/token)", zero=True)


def _plot_points(
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
        lines = _lines(pattern, inputs, set_, n)
        labels = [c.strip() for c in configs.split(",") if c.strip()]
        labels += [label for label in _repairs(repair) if label not in labels]
        if len(labels) < 1 or len(set(labels)) != len(labels):
            raise BadConfig(f"--configs: give distinct configurations, got {configs!r}")
        cfgs = {
            label: _config(
                model, label, dtype, decision_repair, audit=audit, audit_budget=audit_budget
            )
            for label in labels
        }
        for cfg in cfgs.values():
            check_adapter_of(cfg, err)
    except BadConfig as exc:
        _exit(exc.for_cli())
    except CorpsError as exc:
        _exit(str(exc))
    seeds = [seed + i for i in range(len(lines))]

    async def main() -> list[Any]:
        from corps.agents import Runtime
        from corps.engine import Engine

        got = []
        for label, cfg in cfgs.items():  # one engine at a time
            async with Engine.open(cfg) as engine, Runtime(engine) as rt:
                with _progress(len(lines), f"{name} · {label}") as bar:
                    task = bar.add_task("", total=len(lines))
                    got.append(await ev.scores(
                        rt, label, name, lines, seeds, concurrency=concurrency,
                        on_done=lambda t=task: bar.advance(t),
                    ))  # fmt: skip
        return got

    with _quiet():
        try:
            results = anyio.run(main)
        except CorpsError as exc:
            _exit(str(exc), 1)
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
        t.add_row(s.label, _f(s.mean), f"{row['scored']}/{len(lines)}", *cells)
    out.print(t)
    base = next((s for s in results if s.label == "baseline"), None)
    for s in results:
        if base is not None and s is not base:
            report["configs"][s.label]["of_baseline_work"] = s.share_of(base)
    _eval_costs(f"{name}: what each configuration cost", results)
    for s in results:
        for i, why in sorted(s.errors.items())[:5]:
            err.print(f"{s.label} run {i}: {why}", highlight=False)
    if json_out is not None:
        json_out.write_text(json.dumps(report, indent=2) + "\n")
    if plot is not None:
        _plot_points(
            [(s.label, s.ttft, s.mean) for s in results], plot,
            f"{name}, {len(lines)} inputs", "task score",
        )  # fmt: skip


def _eval_costs(title: str, results: list[Any]) -> None:
    """One row per configuration: the context it recomputed (of what it reused, and of
    the baseline's own work when a baseline ran), its mean TTFT and wall time, against
    the first configuration's."""
    first = results[0]
    base = next((s for s in results if s.label == "baseline"), None)
    t = Table(title=title, title_justify="left")
    for col in ("configuration", "recomputed", "of baseline's work", "TTFT ms",
                "TTFT / first", "wall s", "wall / first"):  # fmt: skip
        first_col = col == "configuration"
        t.add_column(col, justify="left" if first_col else "right", overflow="fold",
                     min_width=22 if first_col else None)  # fmt: skip
    for s in results:
        share = "-" if base is None or s is base else f"{s.share_of(base):.0%}"
        t.add_row(
            s.label, f"{s.recomputed:.0%}", share, _f(s.ttft and s.ttft * 1000, 1),
            _ratio(s.ttft, first.ttft), f"{s.wall_s:.1f}", _ratio(s.wall_s, first.wall_s),
        )  # fmt: skip
    out.print(t)
    out.print(
        "[dim]recomputed: share of the context tokens the calls reused that they "
        "recomputed instead; of baseline's work: the tokens recomputed (and encoded by "
        "audits) as a share of the context tokens the baseline encoded for the same "
        "inputs (100%: nothing saved); TTFT: mean over the runs of each run's mean; wall: "
        "the pass over every input, after one untimed run of the first[/]"
    )


# ---- corps distill ----


def distill(
    pattern: Pattern,
    inputs: Annotated[Path, typer.Option(help="JSON lines of pattern inputs.")],
    out_dir: Annotated[Path, typer.Option("--out", help="Where the adapter is saved.")],
    train: Annotated[int, typer.Option(min=1, help="Training traces (the first lines).")] = 200,
    val: Annotated[int, typer.Option(min=1, help="Validation traces (the lines after).")] = 50,
    epochs: Annotated[int, typer.Option(min=1)] = 2,
    rank: Annotated[int, typer.Option(min=1)] = 64,
    alpha: Annotated[int, typer.Option(min=1)] = 32,
    dropout: Annotated[float, typer.Option(min=0.0, max=0.9)] = 0.05,
    lr: Annotated[float, typer.Option(min=0.0)] = 3e-4,
    batch: Annotated[int, typer.Option(min=1, help="Traces per optimizer step.")] = 4,
    schedule: Annotated[
        str,
        typer.Option(
            help="Learning rate over the steps: constant (default), linear (down to 0 at "
            "the last step) or cosine."
        ),
    ] = "constant",
    objective: Annotated[
        str,
        typer.Option(
            help="distribution (default: cross-entropy to the baseline's next-token "
            "distributions at the baseline's tokens) or tokens (the log-loss of the sampled "
            "tokens, the paper's; same optimum, more variance)."
        ),
    ] = "distribution",
    targets: Annotated[
        str,
        typer.Option(
            help="The projections that get LoRA weights: all (default), attention "
            "(q/k/v/o), mlp (gate/up/down), or comma-separated module names."
        ),
    ] = "all",
    scope: Annotated[
        str,
        typer.Option(
            help="Which calls the adapter applies to: all (default), or rewired (only "
            "calls whose context choreography rewired: parents encoded apart, moved, or "
            "over context the call does not read; chain calls keep the base model)."
        ),
    ] = "all",
    set_: Sets = None,
    seed: Seed = 0,
    traces: Annotated[
        Path | None,
        typer.Option(help="Trace cache (JSON lines; default OUT/traces.jsonl); resumable."),
    ] = None,
    model: Model = DEFAULT_MODEL,
    dtype: Dtype = "float32",
    concurrency: Concurrency = 4,
) -> None:
    """Train a LoRA adapter so the choreographed workflow scores baseline runs' tokens as
    the baseline does (the paper's distillation), keeping the best validation epoch."""
    from corps.patterns.evaluation import distill as dist

    try:
        name = registry.canonical(pattern)
        lines = _lines(pattern, inputs, set_, None)
        if len(lines) < train + val:
            raise CorpsError(
                f"{inputs} has {len(lines)} lines; --train {train} --val {val} needs {train + val}"
            )
        lines = lines[: train + val]
        base = _config(model, "baseline", dtype)
        chor = _config(model, "choreographed@none", dtype)  # the adapter alone repairs it
        settings = dist.Settings(
            epochs, rank, alpha, dropout, lr, batch, seed, objective, schedule=schedule,
            targets=dist.targets_of(targets), scope=scope,
        )  # fmt: skip
    except BadConfig as exc:
        _exit(exc.for_cli())
    except (CorpsError, ValueError) as exc:
        _exit(str(exc))
    cache = traces or out_dir / "traces.jsonl"
    seeds = [seed + i for i in range(len(lines))]

    async def collect() -> Any:
        async with AsyncExitStack() as stack:
            rts = await _runtimes(stack, {"baseline": base, "choreographed": chor})
            with _progress(len(lines), f"{name}: baseline traces") as bar:
                task = bar.add_task("", total=len(lines))
                got = await dist.collect(
                    rts["baseline"], rts["choreographed"], name, lines, seeds, cache,
                    concurrency=concurrency, on_done=lambda: bar.advance(task),
                )  # fmt: skip
            return got, rts["choreographed"].engine.model_path

    with _quiet():
        try:
            (got, failed), model_path = anyio.run(collect)
            for i, why in failed:
                err.print(f"run {i}: {why} (left out)", highlight=False)
            train_set = [t for t in got if t.index < train]
            val_set = [t for t in got if t.index >= train]
            if not train_set or not val_set:
                _exit("no training or no validation traces: every run failed", 1)
            err.print(f"{len(train_set)} training and {len(val_set)} validation traces ({cache})")
            steps = Progress(
                TextColumn("training"), BarColumn(), MofNCompleteColumn(),
                TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[tps]} tok/s"),
                TimeElapsedColumn(), TimeRemainingColumn(), console=err, transient=True,
            )  # fmt: skip
            with steps:
                task = steps.add_task("", total=None, loss="-", tps="-")

                def on_step(step: int, total: int, loss: float, tps: float) -> None:
                    steps.update(
                        task, completed=step, total=total, loss=f"{loss:.3f}", tps=f"{tps:.0f}"
                    )

                def on_epoch(e: dist.Epoch) -> None:
                    loss = "" if e.train_loss is None else f"train loss {e.train_loss:.3f}, "
                    steps.console.print(
                        f"epoch {e.epoch}: {loss}validation gap {e.val_gap:.4f} nats/token, "
                        f"training gap {e.train_gap:.4f} ({e.seconds:.0f} s)", highlight=False,
                    )  # fmt: skip

                report = dist.distill(
                    model_path, train_set, val_set, out_dir, settings, on_step=on_step,
                    on_epoch=on_epoch,
                )  # fmt: skip
        except CorpsError as exc:
            _exit(str(exc), 1)
    t = Table(title=f"{name}: validation gap (choreographed - baseline, nats/token)",
              title_justify="left")  # fmt: skip
    cols = ("epoch", "train loss", "train gap", "val gap", "val top-1 agree", "seconds", "tok/s")
    for col in cols:
        t.add_column(col, justify="right")
    for e in report.epochs:
        agree = e.val[-1]["agreement"]
        mark = " *" if e.epoch == report.best_epoch else ""
        t.add_row(f"{e.epoch}{mark}", _f(e.train_loss), _f(e.train_gap, 4), _f(e.val_gap, 4),
                  _f(agree), _f(e.seconds, 1), _f(e.tokens_per_s, 0))  # fmt: skip
    out.print(t)
    cut = 1 - report.after / report.before if report.before > 0 else float("nan")
    out.print(
        f"kept epoch {report.best_epoch}: gap {report.before:.4f} -> {report.after:.4f} "
        f"({cut:.0%} lower); {report.trainable_params:,} trainable of "
        f"{report.total_params:,} parameters; adapter in {out_dir}"
    )


# ---- corps inputs ----


def inputs(
    kind: Annotated[str, typer.Argument(help="multi-qa (generated pairs) or champ (math).")],
    n: Annotated[int, typer.Option(min=1, help="How many lines.")] = 200,
    skip: Annotated[int, typer.Option(min=0, help="champ: start after this many.")] = 0,
    seed: Annotated[int, typer.Option(help="multi-qa: the generator's seed.")] = 0,
    output: Annotated[
        Path | None, typer.Option("--out", "-o", help="File (default: stdout).")
    ] = None,
) -> None:
    """Write input lines with exact answers for fidelity, eval and distill."""
    from corps.patterns.evaluation.inputs import champ_problems, question_pairs

    try:
        if kind.replace("_", "-") == "multi-qa":
            lines = question_pairs(n, seed)
        elif kind == "champ":
            lines = champ_problems(n, skip)
        else:
            raise CorpsError(f"no input kind {kind!r}: multi-qa or champ")
    except CorpsError as exc:
        _exit(str(exc))
    text = "".join(json.dumps(line) + "\n" for line in lines)
    if output is None:
        out.file.write(text)
    else:
        output.write_text(text)
        err.print(f"{len(lines)} lines in {output}")
