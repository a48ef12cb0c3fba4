"""The `corps` command line: the commands wired, each defined in its own module."""

from __future__ import annotations

import typer

from corps.cli import distill as distill_cli
from corps.cli import fidelity as fidelity_cli
from corps.cli import run as run_cli
from corps.cli.bench import bench_app
from corps.cli.chat import chat
from corps.cli.models import models
from corps.cli.options import fail
from corps.cli.serve import serve
from corps.cli.trace_cmd import trace_app

app = typer.Typer(
    name="corps",
    help="Multi-agent LLM workflows over one shared, choreographed KV cache.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(bench_app, name="bench")
app.add_typer(trace_app, name="trace")
app.command()(models)
app.command()(serve)
app.command()(chat)
app.command("run")(run_cli.run)
app.command("fidelity")(fidelity_cli.fidelity)
app.command("eval")(fidelity_cli.evaluate)
app.command("distill")(distill_cli.distill)
app.command("inputs")(distill_cli.inputs)
app.command("scenarios")(run_cli.scenarios)

__all__ = ["app", "fail", "main"]


def main() -> None:  # pragma: no cover - `python -m corps.cli.app`
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
