"""`corps trace view | diff | export`: look at a trace file written with `--trace`."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console, Group
from rich.markup import escape

from corps.cache.errors import CorpsError
from corps.engine.trace.reader import Trace, TraceError
from corps.engine.trace.spans import otlp

trace_app = typer.Typer(
    help="View, compare and export traces written by `corps run --trace FILE`.",
    no_args_is_help=True,
)
out = Console()
err = Console(stderr=True)

AgentOpt = Annotated[
    str | None, typer.Option(help="Only calls of agents whose name contains this.")
]
KindOpt = Annotated[str | None, typer.Option(help="Only prefill or decode calls.")]
SinceOpt = Annotated[
    float | None, typer.Option(help="Only calls still running at or after this time (s).")
]
LimitOpt = Annotated[int, typer.Option(min=1, help="Rows per table at most.")]
FileArg = Annotated[Path, typer.Argument(help="A trace written by --trace.")]
FollowOpt = Annotated[
    bool, typer.Option("--follow", "-f", help="Keep reading while the run writes it.")
]


def _load(path: Path, *, follow: bool = False) -> Trace:
    try:
        trace = Trace.load(path, follow=follow)
    except (TraceError, OSError) as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None
    for w in trace.warnings:
        err.print(f"[yellow]warning:[/] {escape(w)}", highlight=False)
    return trace


def _filter(agent: str | None, kind: str | None, since: float | None):
    from corps.view import Filter

    if kind not in (None, "prefill", "decode"):
        err.print(f"[bold red]error:[/] --kind must be prefill or decode, got {kind!r}")
        raise typer.Exit(2)
    return Filter(agent=agent, kind=kind, since=since)


def _wait_for(file: Path) -> None:
    """--follow on a run that has not written its header yet: wait for it (Ctrl-C stops)."""
    shown = False
    try:
        while not (file.is_file() and file.read_bytes()[:4096].find(b"\n") >= 0):
            if not shown:
                err.print(f"waiting for {file} to be written... (Ctrl-C to stop)")
                shown = True
            time.sleep(0.25)
    except KeyboardInterrupt:
        raise typer.Exit(1) from None


@trace_app.command("view")
def view(
    file: FileArg,
    follow: FollowOpt = False,
    call: Annotated[
        str | None,
        typer.Option("--call", help="Show one call's context in detail: c14 (or 14)."),
    ] = None,
    full: Annotated[bool, typer.Option(help="Whole texts in --call, not the first line.")] = False,
    agent: AgentOpt = None,
    kind: KindOpt = None,
    since: SinceOpt = None,
    limit: LimitOpt = 40,
) -> None:
    """Timeline per agent, KV lineage, message graph, leaks and errors, totals."""
    from corps import view as tv

    flt = _filter(agent, kind, since)
    if follow:
        _wait_for(file)
    trace = _load(file, follow=follow)
    if call is not None:
        number = call.strip().lower().removeprefix("c")
        try:
            out.print(tv.call_detail(trace, int(number), full=full))
        except (KeyError, ValueError):
            ids = sorted(trace.calls)
            span = f"c{ids[0]}..c{ids[-1]}" if ids else "none"
            hint = " (m14 is a message; calls are c14)" if number.startswith("m") else ""
            err.print(f"[bold red]error:[/] no call {call} in {file} (calls: {span}){hint}")
            raise typer.Exit(2) from None
        return
    if not follow:
        for part in tv.overview(trace, flt, limit):
            out.print(part)
        return
    from rich.live import Live

    def frame() -> Group:
        return Group(tv.header(trace), tv.totals(trace, flt), tv.Timeline(trace, flt))

    try:
        with Live(frame(), console=out, refresh_per_second=2, screen=False) as live:
            while not trace.closed:
                time.sleep(0.5)
                if trace.update():
                    live.update(frame())
    except KeyboardInterrupt:
        pass
    for part in tv.overview(trace, flt, limit):
        out.print(part)


@trace_app.command("ui")
def ui(file: FileArg, follow: FollowOpt = False) -> None:
    """Browse a trace interactively: calls, each call's context and parents, filters.

    Keys: arrows move between calls, Tab switches tabs (calls, totals, messages,
    leaks & errors), / filters by agent (Esc clears), f follows a running trace,
    q quits.
    """
    from corps.view.app import TraceApp

    if follow:
        _wait_for(file)
    TraceApp(_load(file, follow=follow), follow=follow).run()


@trace_app.command("diff")
def diff(
    a: Annotated[Path, typer.Argument(help="Trace A.")],
    b: Annotated[Path, typer.Argument(help="Trace B.")],
    limit: LimitOpt = 60,
) -> None:
    """Two runs side by side: calls aligned by agent and step, ratios A/B, first divergence."""
    from corps.view.diff import diff as render

    out.print(render(_load(a), _load(b), limit))


@trace_app.command("export")
def export(
    file: FileArg,
    perfetto: Annotated[
        Path | None, typer.Option(help="Chrome trace JSON for ui.perfetto.dev / chrome://tracing.")
    ] = None,
    otel: Annotated[
        Path | None, typer.Option(help="OpenTelemetry spans as OTLP/JSON (GenAI conventions).")
    ] = None,
    otel_endpoint: Annotated[
        str | None,
        typer.Option(
            help="Send the spans to an OTLP collector with the OpenTelemetry SDK, e.g. "
            "http://localhost:4318/v1/traces (needs pip install 'corps[otel]')."
        ),
    ] = None,
    otel_protocol: Annotated[
        str, typer.Option(help="http/protobuf (default) or grpc (e.g. localhost:4317).")
    ] = "http/protobuf",
    include_text: Annotated[
        bool,
        typer.Option(help="OpenTelemetry spans carry public messages' texts (input, output)."),
    ] = False,
    include_private: Annotated[
        bool,
        typer.Option(help="... and private and shared messages' texts too (implies the above)."),
    ] = False,
    svg: Annotated[Path | None, typer.Option(help="The viewer's overview as SVG.")] = None,
    html: Annotated[Path | None, typer.Option(help="The viewer's overview as HTML.")] = None,
    width: Annotated[int, typer.Option(min=60, help="Columns for --svg / --html.")] = 120,
) -> None:
    """Export a trace to Perfetto, OpenTelemetry, SVG or HTML.

    OpenTelemetry spans carry no message text unless asked: --include-text adds
    public messages' texts, --include-private every message's.
    """
    from corps.view import export as tx

    if not any((perfetto, otel, otel_endpoint, svg, html)):
        err.print(
            "[bold red]error:[/] say what to export: "
            "--perfetto, --otel, --otel-endpoint, --svg or --html"
        )
        raise typer.Exit(2)
    trace = _load(file)
    if perfetto is not None:
        perfetto.write_text(json.dumps(tx.perfetto(trace)))
        out.print(f"wrote {perfetto} (open it in https://ui.perfetto.dev)")
    if otel is not None or otel_endpoint is not None:
        spans = otlp(trace, "all" if include_private else "public" if include_text else "none")
        if otel is not None:
            otel.write_text(json.dumps(spans))
            out.print(f"wrote {otel} (OTLP/JSON)")
        if otel_endpoint is not None:
            from corps.engine.trace import exporter as trace_otel

            try:
                n = trace_otel.send(spans, otel_endpoint, protocol=otel_protocol)
            except CorpsError as exc:
                err.print(f"[bold red]error:[/] {exc}")
                raise typer.Exit(1) from None
            out.print(f"sent {n} spans of {file.name} to {otel_endpoint} ({otel_protocol})")
    if svg is not None or html is not None:
        console = tx.record(trace, width=width)
        if svg is not None:
            svg.write_text(tx.svg(console, f"corps trace {file.name}"))
            out.print(f"wrote {svg}")
        if html is not None:
            html.write_text(console.export_html(clear=False))
            out.print(f"wrote {html}")
