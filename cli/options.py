"""Options and error reporting shared by the `corps` commands."""

from __future__ import annotations

import os
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from corps.cache.errors import CorpsError
from corps.engine.config import EngineConfig

#: errors and notes go to stderr; results to stdout
err = Console(stderr=True)

RepairOpt = Annotated[
    str | None,
    typer.Option(
        help="What choreographed calls whose context is rewired recompute in their own "
        "context: none, first:K, recompute:R or query:R (a share), full, temp:T, serial (parents "
        "laid end to end first), or several joined by '+'; or auto (chosen per workflow and "
        "agent from audits; auto:P starts new agents at rung P) (docs/fidelity.md)."
    ),
]
RepairBoundOpt = Annotated[
    bool,
    typer.Option(
        "--repair-bound/--no-repair-bound",
        help="Cap every repair at what the baseline would encode of its call's context "
        "(the default; docs/fidelity.md), or let policies recompute what they choose.",
    ),
]
DecisionRepairOpt = Annotated[
    str | None,
    typer.Option(
        help="The repair the built-in patterns give their decision steps (a tree of "
        "thoughts' voters) when --repair is not given: a policy as --repair takes, or none "
        "(default: query:0.3; docs/fidelity.md).",
    ),
]


def repair_fields(repair: str | None, decision: str | None) -> dict[str, str]:
    """EngineConfig fields of --repair and --decision-repair: a --repair given applies
    to every call (the decision steps' default with it: `--repair none` is plain
    choreography), but "auto" starts the decision steps at their repair's rung; else
    the decision steps get --decision-repair, or the default."""
    fields = {} if decision is None else dict(decision_repair=decision)
    if repair is None:
        return fields
    if repair.strip().lower() == "auto":
        return dict(repair=repair, **fields)
    return dict(repair=repair, decision_repair="none")


AuditOpt = Annotated[
    int,
    typer.Option(
        min=0,
        max=1_000_000,
        help="Audit 1 in N choreographed decodes of each workflow and agent against the "
        "baseline's encoding of the same text, and report the gap (0: off; with --repair "
        "auto: 1 in 4 unless given) (docs/fidelity.md).",
    ),
]
AuditBudgetOpt = Annotated[
    float,
    typer.Option(
        min=0.001,
        max=1.0,
        help="The share of the tokens the engine encodes that audits may encode besides "
        "(1: every due audit runs).",
    ),
]
ModelOpt = Annotated[
    str, typer.Option("--model", "-m", help="Alias, local HF directory or hub id.")
]


def dtype_option(value: str) -> str:
    """Checked by the engine's config, before anything loads."""
    try:
        return EngineConfig.of(dtype=value).dtype
    except CorpsError as exc:
        raise typer.BadParameter(str(exc)) from None


def weights_option(value: str) -> str:
    """Checked by the engine's config, before anything loads."""
    try:
        return EngineConfig.of(weights=value).weights
    except CorpsError as exc:
        raise typer.BadParameter(str(exc)) from None


WeightsOpt = Annotated[
    str,
    typer.Option(
        help="How projections hold their weights: auto (default: a GGUF model, as the "
        "embedded default, runs its own 4- and 8-bit blocks; others stay dense), dense "
        "(de-quantized, exact against transformers in float32), gguf, int8 (CPU) or int4 "
        "(quantized on load).",
        callback=weights_option,
    ),
]

PrecompiledOpt = Annotated[
    str,
    typer.Option(
        help="The lone decode step compiled ahead of time for this CPU (quantized weights, "
        "e.g. the default model's GGUF): auto (load it if built, else build it in the "
        "background once this command exits), build (build it now if missing: about a "
        "minute) or off.",
        envvar="CORPS_PRECOMPILED",
    ),
]
DtypeOpt = Annotated[
    str,
    typer.Option(
        help="auto (default: each projection's kernel measured fastest on this CPU, once; "
        "within 16-bit rounding of float32), mixed (16-bit weights by a fixed rule), "
        "float32 (exact against transformers), bfloat16 or float16.",
        callback=dtype_option,
    ),
]
DeviceOpt = Annotated[str, typer.Option(help="cpu or cuda.")]


def one_line(exc: BaseException) -> str:
    """An error as one line: an exception group by its first cause (and how many more
    there were), any exception but corps' own (which say what to do) with its type."""
    more = 0
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        more += len(exc.exceptions) - 1
        exc = exc.exceptions[0]
    text = str(exc) if isinstance(exc, CorpsError) else f"{type(exc).__name__}: {exc}"
    text = " ".join(text.split())
    return f"{text} (and {more} more)" if more else text


#: said after an error that did not come from bad input
DEBUG_HINT = "CORPS_DEBUG=1 shows the traceback"


def fail(exc: BaseException) -> None:
    """Print a deliberate error in one line (a traceback only with CORPS_DEBUG=1)."""
    if os.environ.get("CORPS_DEBUG"):
        raise exc
    err.print(f"[bold red]error:[/] {escape(one_line(exc))}", highlight=False, soft_wrap=True)
    raise typer.Exit(1)


def bad(message: str) -> None:
    """Refuse bad input in one line, before anything loads (exit status 2)."""
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)
