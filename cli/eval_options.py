"""What `corps fidelity`, `eval` and `distill` share: their options, input lines,
engine configurations and runtimes, progress bars, number formats."""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from contextlib import AsyncExitStack, contextmanager
from pathlib import Path
from typing import Annotated, Any

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

from corps.cache.visibility import LeakWarning
from corps.cli.options import repair_fields
from corps.cli.run import read_inputs
from corps.cli.scenario import parse_sets
from corps.engine.config import BadConfig, EngineConfig
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


def exit_with(message: str, code: int = 2) -> None:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


def input_lines(
    pattern: str, inputs: Path | None, sets: list[str] | None, n: int | None
) -> list[dict]:
    """The input lines (each checked against the pattern), at most n; without
    --inputs, n copies of the pattern's defaults (the seeds make them differ)."""
    fn = registry.get(pattern)
    common = parse_sets(sets or [])
    lines = read_inputs(inputs) if inputs is not None else [{}] * (n or 8)
    lines = [{**common, **line} for line in lines[: n or None]]
    for i, line in enumerate(lines):
        registry.validate(fn, split_line(line)[0], f"line {i + 1}: ")
    return lines


def config_of(
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


def repairs_of(repair: str | None) -> list[str]:
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


def progress(total: int, what: str) -> Progress:
    return Progress(
        TextColumn(what), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TimeRemainingColumn(), console=err, transient=True,
    )  # fmt: skip


async def runtimes(stack: AsyncExitStack, configs: dict[str, EngineConfig]) -> dict[str, Any]:
    from corps.agents import Runtime
    from corps.engine import Engine

    rts = {}
    for label, cfg in configs.items():
        engine = await stack.enter_async_context(Engine.open(cfg))
        rts[label] = await stack.enter_async_context(Runtime(engine))
    return rts


@contextmanager
def quiet() -> Iterator[None]:
    """Leaks are counted, not warned about; peft's deprecation notice is not ours."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LeakWarning)
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated")
        yield


def num(x: float | None, digits: int = 3) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"
