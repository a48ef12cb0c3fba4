"""The online fidelity audit's figures as a table (`corps run --audit N`, `--repair auto`)."""

from __future__ import annotations

from typing import Any

from rich.table import Table


def audit_table(report: Any) -> Table:
    """One row per workflow, agent and repair policy (an `AuditReport`), then all of
    them; the caption says each key's policy under repair "auto" and the shadows
    that could not run."""
    table = Table(title="fidelity audit (against the baseline's encoding)")
    for col in ("workflow", "agent", "repair"):
        table.add_column(col)
    for col in ("calls", "gap (nats/token)", "agree", "shadow tokens"):
        table.add_column(col, justify="right")
    for r in [*report.rows, report.total]:
        total = r is report.total
        table.add_row(
            "all" if total else (r.key.workflow or "-"),
            "" if total else (r.key.agent or "-"),
            "" if total else r.key.repair,
            str(r.calls),
            "-" if r.calls == 0 else f"{r.gap:.4f}",
            "-" if r.calls == 0 else f"{r.agreement:.0%}",
            str(r.tokens),
            style="bold" if total else "",
        )
    notes = [f"auto: {w or '-'} / {a or '-'} at {p}" for (w, a), p in report.auto.items()]
    if report.failed:
        notes.append(f"{report.failed} audits could not run (the engine closed, or no room)")
    table.caption = "; ".join(notes) or None
    return table
