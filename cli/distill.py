"""`corps distill` (an adapter trained toward the baseline on a pattern's traces) and
`corps inputs` (input lines with exact answers)."""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Annotated, Any

import anyio
import typer
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
from corps.cli.eval_options import (
    Concurrency,
    Dtype,
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
    runtimes,
)
from corps.engine.config import DEFAULT_MODEL, BadConfig
from corps.patterns import registry


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
        lines = input_lines(pattern, inputs, set_, None)
        if len(lines) < train + val:
            raise CorpsError(
                f"{inputs} has {len(lines)} lines; --train {train} --val {val} needs {train + val}"
            )
        lines = lines[: train + val]
        base = config_of(model, "baseline", dtype)
        chor = config_of(model, "choreographed@none", dtype)  # the adapter alone repairs it
        settings = dist.Settings(
            epochs, rank, alpha, dropout, lr, batch, seed, objective, schedule=schedule,
            targets=dist.targets_of(targets), scope=scope,
        )  # fmt: skip
    except BadConfig as exc:
        exit_with(exc.for_cli())
    except (CorpsError, ValueError) as exc:
        exit_with(str(exc))
    cache = traces or out_dir / "traces.jsonl"
    seeds = [seed + i for i in range(len(lines))]

    async def collect() -> Any:
        async with AsyncExitStack() as stack:
            rts = await runtimes(stack, {"baseline": base, "choreographed": chor})
            with progress(len(lines), f"{name}: baseline traces") as bar:
                task = bar.add_task("", total=len(lines))
                got = await dist.collect(
                    rts["baseline"], rts["choreographed"], name, lines, seeds, cache,
                    concurrency=concurrency, on_done=lambda: bar.advance(task),
                )  # fmt: skip
            return got, rts["choreographed"].engine.model_path

    with quiet():
        try:
            (got, failed), model_path = anyio.run(collect)
            for i, why in failed:
                err.print(f"run {i}: {why} (left out)", highlight=False)
            train_set = [t for t in got if t.index < train]
            val_set = [t for t in got if t.index >= train]
            if not train_set or not val_set:
                exit_with("no training or no validation traces: every run failed", 1)
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
            exit_with(str(exc), 1)
    t = Table(title=f"{name}: validation gap (choreographed - baseline, nats/token)",
              title_justify="left")  # fmt: skip
    cols = ("epoch", "train loss", "train gap", "val gap", "val top-1 agree", "seconds", "tok/s")
    for col in cols:
        t.add_column(col, justify="right")
    for e in report.epochs:
        agree = e.val[-1]["agreement"]
        mark = " *" if e.epoch == report.best_epoch else ""
        t.add_row(f"{e.epoch}{mark}", num(e.train_loss), num(e.train_gap, 4), num(e.val_gap, 4),
                  num(agree), num(e.seconds, 1), num(e.tokens_per_s, 0))  # fmt: skip
    out.print(t)
    cut = 1 - report.after / report.before if report.before > 0 else float("nan")
    out.print(
        f"kept epoch {report.best_epoch}: gap {report.before:.4f} -> {report.after:.4f} "
        f"({cut:.0%} lower); {report.trainable_params:,} trainable of "
        f"{report.total_params:,} parameters; adapter in {out_dir}"
    )


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
        exit_with(str(exc))
    text = "".join(json.dumps(line) + "\n" for line in lines)
    if output is None:
        out.file.write(text)
    else:
        output.write_text(text)
        err.print(f"{len(lines)} lines in {output}")
