"""corps.view: the trace viewer's pictures (`corps trace view`, `corps run --live`,
the exports): rich renderables of a loaded `Trace`, and the Textual app that arranges them.

The public views are importable from here; `overview` is what `corps trace view FILE`
shows, in order.
"""

from __future__ import annotations

from collections.abc import Iterator

from corps.engine.trace.reader import Trace, names_of
from corps.view.messages import call_detail, graph, leak_path, lineage, problems, segments
from corps.view.timeline import (
    ALL,
    Filter,
    Timeline,
    calls,
    cid,
    clip,
    group_of,
    header,
    ms,
)
from corps.view.totals import (
    busy,
    critical_path,
    describe_fit,
    reads,
    step_fit,
    steps,
    totals,
    workflow_times,
    workflows,
)

__all__ = [
    "ALL", "Filter", "Timeline", "busy", "call_detail", "calls", "cid", "clip", "critical_path",
    "describe_fit", "graph", "group_of", "header", "leak_path", "lineage", "ms", "names_of",
    "overview", "problems", "reads", "segments", "step_fit", "steps", "totals",
    "workflow_times", "workflows",
]  # fmt: skip


def overview(trace: Trace, flt: Filter = ALL, limit: int = 40) -> Iterator:
    """Everything `corps trace view FILE` shows, in order."""
    yield header(trace)
    yield totals(trace, flt)
    if (table := steps(trace)) is not None:
        yield table
    if (table := workflows(trace)) is not None:
        yield table
    yield Timeline(trace, flt)
    yield lineage(trace, flt, limit)
    yield graph(trace, flt, limit)
    yield problems(trace)
