"""`corps trace diff` (corps.view.diff): alignment, ratios, first divergence."""

from __future__ import annotations

import io

from rich.console import Console

from corps.engine.trace.reader import Trace
from corps.view.diff import align, diff


def render(part) -> str:
    console = Console(record=True, width=120, file=io.StringIO())
    console.print(part)
    return console.export_text()


def test_a_trace_against_itself_is_all_the_same(traces):
    a = Trace.load(traces["debate"])
    pairs = align(a, a)
    assert len(pairs) == len(a.calls) and all(p.a is p.b for p in pairs)
    text = render(diff(a, a))
    assert "every aligned call produced the same text" in text
    assert "1.00x" in text


def test_modes_align_by_agent_and_step(traces):
    a, b = Trace.load(traces["debate"]), Trace.load(traces["debate@baseline"])
    pairs = align(a, b)
    assert all(p.a is not None and p.b is not None for p in pairs)
    assert all(p.a.kind == p.b.kind for p in pairs)
    assert all(p.agent == p.agent.split("/")[-1] for p in pairs)  # run ids dropped
    text = render(diff(a, b))
    assert "choreographed" in text and "baseline" in text and "totals" in text


def test_first_divergence_is_reported(traces, tmp_path):
    a = Trace.load(traces["debate"])
    lines = traces["debate"].read_text().splitlines()
    texts = [i for i, x in enumerate(lines) if '"type":"text"' in x]
    decode_ids = {c.end.message for c in a.calls.values() if c.kind == "decode"}
    target = next(i for i in texts if int(lines[i].split('"id":')[1].split(",")[0]) in decode_ids)
    head, _, _ = lines[target].partition('"text":')
    lines[target] = head + '"text":"something else entirely"}'
    path = tmp_path / "b.jsonl"
    path.write_text("\n".join(lines) + "\n")
    text = render(diff(a, Trace.load(path)))
    assert "first divergence" in text and "something else entirely" in text
