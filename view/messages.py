"""The views of messages: KV lineage (who encoded what, who reused it), the message
graph, the problems a trace shows (leaks, gaps, overlaps) and one call's detail with
its context picture."""

from __future__ import annotations

from collections import defaultdict

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.table import Table
from rich.text import Text

from corps.engine.trace.reader import CallRec, Trace, names_of
from corps.view.timeline import ALL, Filter, axis, calls, cid, clip, group_of, ms

# ---- KV lineage ----


def segments(trace: Trace, c: CallRec) -> list[tuple[str, int, int, str]]:
    """The call's prompt as (what, start, end, style): its parents where they sat (reused
    in choreographed mode; re-rendered as text, maybe prefix-cached, in baseline), its
    own new tokens, and what it generated."""
    e = c.end
    if e is None:
        return []
    out = []
    for mid, off in sorted(zip(e.parents, e.offsets, strict=False), key=lambda p: p[1]):
        msg = trace.messages.get(mid)
        n = msg.tokens if msg is not None else 0
        out.append((f"m{mid}", off, off + n, "cyan"))
    start = e.new_offset or 0
    own = _own_tokens(trace, c) or max(0, e.encoded - e.generated)
    out.append(("new", start, start + own, "yellow"))
    if e.generated:
        out.append(("gen", start + own, start + own + e.generated, "green"))
    return out


def _own_tokens(trace: Trace, c: CallRec) -> int:
    msg = trace.messages.get(c.end.message) if c.end and c.end.message is not None else None
    return 0 if msg is None else msg.tokens - (c.end.generated if c.end else 0)


def lineage(trace: Trace, flt: Filter = ALL, limit: int = 40) -> Table:
    names = names_of(trace)
    rows = [c for c in calls(trace, flt) if c.end is not None]
    table = Table(
        box=box.SIMPLE_HEAD,
        title="KV lineage: each call's prompt as reused / newly encoded / generated",
    )
    groups = group_of(trace)
    for col, just in (
        ("call", "right"),
        ("group", "left"),
        ("agent", "left"),
        ("kind", "left"),
        ("prompt segments (message@start..end)", "left"),
        ("reuse", "right"),
        ("saved", "right"),
    ):
        short = col.split(" ")[0]  # a header wraps between words, never inside one
        table.add_column(col, justify=just, overflow="fold", min_width=len(short))
    for c in rows[:limit]:
        e = c.end
        segs = Text()
        for what, a, b, style in segments(trace, c):
            if segs:
                segs.append(" ")
            segs.append(f"{what}@{a}..{b}", style=style)
        total = e.reused + e.encoded
        ratio = f"{e.reused / total:.0%}" if total else "-"
        status = "" if e.status == "ok" else f" [{e.status}]"
        row = (cid(c.id), groups.get(c.id, ""), names.lane(c), c.kind + status)
        table.add_row(*row, segs, ratio, f"{e.reused} tok")
    if len(rows) > limit:
        table.caption = f"{len(rows) - limit} more calls: narrow with --agent/--kind/--since"
    return table


# ---- message graph ----


def depths(trace: Trace) -> dict[int, int]:
    """Each message's round: 0 for roots, else 1 + its deepest parent's."""
    out: dict[int, int] = {}
    for mid in sorted(trace.messages):
        parents = [out.get(p, 0) for p in trace.messages[mid].parents]
        out[mid] = 1 + max(parents) if parents else 0
    return out


def readers(trace: Trace) -> dict[int, list[int]]:
    out: dict[int, list[int]] = defaultdict(list)
    for mid, msg in trace.messages.items():
        for p in msg.parents:
            out[p].append(mid)
    return out


def graph(trace: Trace, flt: Filter = ALL, limit: int = 60) -> Table:
    names = names_of(trace)
    depth, read_by = depths(trace), readers(trace)
    leaked = {lk.parent for lk in trace.leaks}
    table = Table(
        box=box.SIMPLE_HEAD, title="message graph (by round): parents in order, with their offsets"
    )
    for col in ("round", "msg", "role", "owner", "visibility", "parents@offset", "read by", ""):
        table.add_column(col, overflow="fold", min_width=len(col))
    shown = [
        m
        for m in trace.messages.values()
        if flt.agent is None or flt.agent in (m.owner or "(engine)")
    ]
    shown.sort(key=lambda m: (depth[m.id], m.id))
    for m in shown[:limit]:
        marks = []
        if len(m.parents) > 1:
            marks.append("join")
        if len(read_by.get(m.id, [])) > 1:
            marks.append(f"fork x{len(read_by[m.id])}")
        if m.view_of is not None:
            marks.append(f"clean copy of m{m.view_of}")
        if m.id in trace.freed:
            marks.append("freed")
        style = "red" if m.id in leaked else ""
        parents = " ".join(f"m{p}@{o}" for p, o in zip(m.parents, m.offsets, strict=False))
        table.add_row(
            str(depth[m.id]),
            Text(f"m{m.id}", style=style),
            m.role,
            names(m.owner),
            m.visibility,
            parents or "-",
            " ".join(f"m{r}" for r in read_by.get(m.id, [])) or "-",
            Text(", ".join(marks), style=style or "dim"),
        )
    if len(shown) > limit:
        table.caption = f"{len(shown) - limit} more messages"
    return table


def leak_path(trace: Trace, start: int, target: int) -> list[int]:
    """Message ids from `start` back through parents to `target` (shortest), or []."""
    prev: dict[int, int | None] = {start: None}
    frontier = [start]
    while frontier:
        nxt = []
        for mid in frontier:
            if mid == target:
                path = [mid]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return path[::-1]
            msg = trace.messages.get(mid)
            for p in msg.parents if msg else ():
                if p not in prev:
                    prev[p] = mid
                    nxt.append(p)
        frontier = nxt
    return []


def problems(trace: Trace) -> Group:
    """Leaks (with the path by which each hidden source reached the reader) and errors."""
    names = names_of(trace)
    parts: list = []
    seen: dict[tuple, list[int | None]] = defaultdict(list)
    for lk in trace.leaks:
        seen[(lk.reader, lk.parent, tuple(lk.sources), lk.policy, lk.call)].append(lk.call_id)
    for (reader, parent, sources, policy, call), ids in seen.items():
        kind = call.split(" by ")[0]
        which = ", ".join(cid(i) for i in ids if i is not None)
        calls = f" (call{'s' if len(ids) > 1 else ''} {which})" if which else ""
        line = Text(f"leak ({policy}): {names(reader)}'s {kind}{calls} ", "red")
        line.append(f"attended to m{parent}, whose encoding carries ")
        for src in sources:
            msg = trace.messages.get(src)
            who = f"{names(msg.owner)}'s {msg.visibility} {msg.role}" if msg else "?"
            path = leak_path(trace, parent, src)
            line.append(f"m{src} ({who}) via ", style="bold red")
            line.append(" <- ".join(f"m{p}" for p in path) or "?", style="red")
            line.append("; ")
        parts.append(line)
    for c in trace.calls.values():
        if c.status == "error":
            parts.append(
                Text(f"error: call {cid(c.id)} ({names.lane(c)}): {c.end.error}", "bold red")
            )
    for a in trace.actors:
        if not a.ok:
            parts.append(Text(f"{a.event}: {names(a.agent)}: {a.detail}", "red"))
    for e in trace.errors:
        parts.append(Text(f"error in {e.where}: {e.detail}", "bold red"))
    for r in trace.reencodes:
        parts.append(Text(f"re-encoded m{r.message} for {names(r.reader)} as m{r.clean}", "dim"))
    for w in trace.switches:
        who = f"{w.workflow or 'no workflow'} / {names(w.agent or None)}"
        line = f"repair auto: {who}: {w.before} -> {w.after} ({w.why}; audited gap {w.gap:.4f})"
        parts.append(Text(line, "yellow"))
    if not parts:
        parts.append(Text("no leaks, no errors", style="green"))
    return Group(Text("leaks and errors", style="bold"), *parts)


# ---- per-call detail ----


def call_detail(trace: Trace, call_id: int, full: bool = False) -> Group:
    """The context as the model saw it: parents in position order, gaps, overlaps, texts."""
    c = trace.calls.get(call_id)
    if c is None:
        raise KeyError(call_id)
    names = names_of(trace)
    e = c.end
    head = Text(f"call {cid(c.id)}: {c.kind} by {names.lane(c)} ({c.status})", style="bold")
    if e is None:
        return Group(head, Text("still pending: no context recorded yet", style="cyan"))
    facts = (
        f"queued {c.start:.3f}s · ttft {ms(e.ttft_s)} · decode {ms(e.decode_s)} · "
        f"encoded {e.encoded} · reused {e.reused} · generated {e.generated}"
    )
    if e.repaired:
        facts += f" · repaired {e.repaired} ({e.repair})"
    elif e.repair:
        facts += f" · read a context another call repaired ({e.repair})"
    if e.message is not None:
        facts += f" · made m{e.message}"
    parts: list = [head, Text(facts)]
    audited = next((a.call for a in trace.audits.values() if a.shadow == call_id), None)
    if audited is not None:
        parts.append(Text(f"the shadow of call {cid(audited)}'s fidelity audit: the baseline's "
                          "encoding of its context, freed once compared", style="dim"))  # fmt: skip
    a = trace.audits.get(call_id)
    if a is not None:
        parts.append(Text(
            f"audited against the baseline (shadow call {cid(a.shadow)}): gap {a.gap:.4f} "
            f"nats/token over its first {a.positions} positions, agreement {a.agreement:.0%}",
            style="yellow" if a.agreement < 1 else "green",
        ))  # fmt: skip
    if e.error:
        parts.append(Text(f"error: {e.error}", style="bold red"))
    parts.append(ContextPicture(segments(trace, c)))
    for mid, off in sorted(zip(e.parents, e.offsets, strict=False), key=lambda p: p[1]):
        msg = trace.messages.get(mid)
        text = clip(trace.text(mid), None if full else 160)
        who = f"{names(msg.owner)}'s {msg.visibility} {msg.role}" if msg else "?"
        parts.append(Text.assemble((f"m{mid} @{off} ", "cyan"), (f"[{who}] ", "dim"), text))
    if e.message is not None:
        text = clip(trace.text(e.message), None if full else 400)
        parts.append(Text.assemble((f"-> m{e.message} ", "green"), text))
    return Group(*parts)


class ContextPicture:
    """One row per segment over a shared position axis, like figure 3 of the paper;
    a last row marks gaps (positions nobody fills) and overlaps (filled twice)."""

    def __init__(self, segs: list[tuple[str, int, int, str]]) -> None:
        self.segs = segs

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if not self.segs:
            return
        hi = max(b for _, _, b, _ in self.segs)
        label_w = 14
        width = max(10, options.max_width - label_w - 1)
        scale = width / max(hi, 1)
        cover = [0] * width
        for what, a, b, style in self.segs:
            x0, x1 = int(a * scale), max(int(a * scale) + 1, int(b * scale))
            row = Text(f"{what} {a}..{b}".ljust(label_w)[:label_w])
            row.append(" " * x0)
            row.append("█" * (x1 - x0), style=style)
            yield row
            if what.startswith("m"):
                for x in range(x0, min(x1, width)):
                    cover[x] += 1
        ctx_end = min(
            width, int(min(a for w, a, _, _ in self.segs if not w.startswith("m")) * scale)
        )
        marks = Text("gaps/overlaps".ljust(label_w)[:label_w])
        for x in range(width):
            if x < ctx_end and cover[x] == 0:
                marks.append("╌", style="yellow")
            elif cover[x] > 1:
                marks.append("▲", style="bold red")
            else:
                marks.append(" ")
        yield marks
        yield Text("position".ljust(label_w)) + axis(0, hi, width, unit="pos")
