"""`corps bench serve`'s report: the table of cells, the ratios against running alone and
the baseline, the plot."""

from __future__ import annotations

from corps.bench.serve import Cell, Report


def table(report: Report):
    from rich.table import Table

    t = Table(
        title=f"open-loop load on {report.model}: saturation {report.saturation_per_s * 60:.1f} "
        "workflows/min"
        + (f" ({at} in flight)" if (at := report.saturation_concurrency) else "")
        + f", {report.duration_s:.0f} s of arrivals per cell"
        + (f" x {report.schedules} schedules, pooled" if report.schedules > 1 else "")
        + (f", {report.chat} chat streams" if report.chat else "")
    )
    cols = ["load", "policy", "wf", "failed", "wf/min", "tok/s", "lat p50", "p90", "p99"]
    if report.chat:
        cols += ["chat TTFT p50", "p99", "TPOT p50", "p99"]
    cols += ["busy", "max queue", "mean batch"]
    gated = any(c.max_waiting for c in report.cells)
    if gated:
        cols += ["max wf waiting"]
    slow = any(c.slowdown for c in report.cells)
    if slow:
        cols += ["slowdown p50", "p99"]
    for col in cols:
        t.add_column(col, justify="left" if col == "policy" else "right")
    floors = dict(report.alone_s)
    for c in report.cells:
        if (floor := floors.pop(f"{c.load:g}", None)) is not None:  # each workflow by itself
            lat = [f"{floor.get(k, float('nan')):.2f}" for k in ("p50", "p90", "p99")]
            t.add_row(f"{c.load:.2f}", "alone", *[""] * 4, *lat, *[""] * (len(cols) - 9))
        lat = [f"{c.latency_s.get(k, float('nan')):.2f}" for k in ("p50", "p90", "p99")]
        row = [f"{c.load:.2f}", c.policy, str(c.workflows), str(c.failed),
               f"{c.workflows_per_min:.1f}", f"{c.tokens_per_s:.0f}", *lat]  # fmt: skip
        if report.chat:
            row += [f"{c.chat_ttft_s.get('p50', float('nan')) * 1e3:.0f} ms",
                    f"{c.chat_ttft_s.get('p99', float('nan')) * 1e3:.0f} ms",
                    f"{c.chat_tpot_s.get('p50', float('nan')) * 1e3:.0f} ms",
                    f"{c.chat_tpot_s.get('p99', float('nan')) * 1e3:.0f} ms"]  # fmt: skip
        row += [f"{c.busy:.0%}", str(c.max_queue), f"{c.mean_running:.1f}"]
        if gated:
            row.append(str(c.max_waiting))
        if slow:
            row += [f"{c.slowdown.get(k, float('nan')):.2f}x" for k in ("p50", "p99")]
        t.add_row(*row)
    return t


def ratios(report: Report):
    """Each policy against fcfs at the same load (p99 latency, throughput, tokens
    sampled, chat time per token), and the chat streams against the same streams on
    an idle engine. Tokens / fcfs says whether the two did the same work: in dtype
    auto a schedule may sample other tokens under another policy (a debate that runs
    one round more), and its latencies then compare unlike work; float32 keeps the
    tokens equal. With the workflows' latencies alone, the fcfs row says how low any
    policy's p99 could go (the floor: the workflows' p99 alone, over fcfs's p99)."""
    from rich.table import Table

    t = Table(title="against fcfs at the same load (targets: workflow p99 <= 0.6x, "
                    "throughput >= 0.95x; chat TPOT p99 <= 1.5x idle)")  # fmt: skip
    cols = ["load", "policy", "p99 latency / fcfs", "throughput / fcfs", "tokens / fcfs"]
    cols += ["chat TPOT p99 / fcfs", "chat TPOT p99 / idle"]
    if report.alone_s:
        cols += ["floor p99 / fcfs"]
    for col in cols:
        t.add_column(col, justify="left" if col == "policy" else "right")
    by = {(c.load, c.policy): c for c in report.cells}
    idle = by.get((0.0, "idle"))

    def tpot(c: Cell, ref: Cell | None) -> str:
        if ref is None or not c.chat_tpot_s or not ref.chat_tpot_s:
            return "-"
        return f"{c.chat_tpot_s['p99'] / ref.chat_tpot_s['p99']:.2f}x"

    for c in report.cells:
        base = by.get((c.load, "fcfs"))
        if c.policy == "idle" or base is None:
            continue
        p99 = c.latency_s.get("p99", 0) / max(1e-9, base.latency_s.get("p99", 1e-9))
        tp = c.workflows_per_min / max(1e-9, base.workflows_per_min)
        versus = "-" if c.policy == "fcfs" else f"{p99:.2f}x"
        through = "-" if c.policy == "fcfs" else f"{tp:.2f}x"
        work = "-" if c.policy == "fcfs" or not base.tokens else f"{c.tokens / base.tokens:.2f}x"
        vs_fcfs = "-" if c.policy == "fcfs" else tpot(c, base)
        row = [f"{c.load:.2f}", c.policy, versus, through, work, vs_fcfs, tpot(c, idle)]
        if report.alone_s:
            floor = report.alone_s.get(f"{c.load:g}", {}).get("p99")
            fcfs = base.latency_s.get("p99")
            best = "-" if c.policy != "fcfs" or not floor or not fcfs else f"{floor / fcfs:.2f}x"
            row.append(best)
        t.add_row(*row)
    return t


def plot(report: Report, path: str) -> None:
    """PNG: workflow latency p99 and throughput against load, a line per policy (and
    chat time per output token p99 with chat streams). Needs the `plot` extra."""
    from corps.bench.plotting import pyplot

    plt = pyplot()
    panels = [("workflow latency p99 (s)", lambda c: c.latency_s.get("p99")),
              ("workflows / min", lambda c: c.workflows_per_min)]  # fmt: skip
    if report.chat:
        panels.append(("chat TPOT p99 (ms)", lambda c: 1e3 * c.chat_tpot_s.get("p99", 0) or None))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4))
    policies = list(dict.fromkeys(c.policy for c in report.cells if c.policy != "idle"))
    for ax, (label, value) in zip(axes, panels, strict=True):
        for policy in policies:
            cells = sorted((c for c in report.cells if c.policy == policy), key=lambda c: c.load)
            points = [(c.load, value(c)) for c in cells if value(c) is not None]
            ax.plot([x for x, _ in points], [y for _, y in points], marker="o", label=policy)
        if ax is axes[0] and report.alone_s:  # the floor under every policy's p99
            floor = sorted((float(x), v["p99"]) for x, v in report.alone_s.items() if v)
            ax.plot([x for x, _ in floor], [y for _, y in floor], "k--", label="alone (floor)")
        ax.set_xlabel("load (fraction of saturation)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"corps bench serve: {report.model}, saturation "
                 f"{report.saturation_per_s * 60:.1f} workflows/min")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
