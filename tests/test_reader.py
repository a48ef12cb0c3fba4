"""Reading trace files (corps.engine.trace.reader): bad files, truncation, following, lazy texts."""

from __future__ import annotations

import json

import pytest

from corps.engine.trace.events import Header
from corps.engine.trace.reader import Names, Trace, TraceError


def write(path, *lines: str, newline: bool = True) -> None:
    path.write_text("\n".join(lines) + ("\n" if newline else ""))


HEADER = Header(model="m", mode="choreographed").model_dump_json()
QUEUED = json.dumps(dict(type="queued", t=0.1, call=1, kind="prefill"))
END = json.dumps(dict(type="end", t=0.2, call=1, kind="prefill", status="ok", message=0))
MSG = json.dumps(dict(type="message", t=0.2, id=0, role="user", kind="prefill", call=1))
TEXT = json.dumps(dict(t=0.2, type="text", id=0, text="hello\nthere"), separators=(",", ":"))


def test_reads_calls_messages_and_texts_lazily(tmp_path):
    path = tmp_path / "t.jsonl"
    write(path, HEADER, QUEUED, MSG, TEXT, END)
    trace = Trace.load(path)
    assert trace.calls[1].status == "ok" and trace.messages[0].role == "user"
    assert trace._texts == {0: path.read_bytes().index(b'{"t":0.2,"type":"text"')}
    assert trace.text(0) == "hello\nthere" and trace.text(99) == ""
    assert trace.producer(0) is trace.calls[1]
    assert not trace.closed and trace.warnings == []


def test_truncated_last_line_is_skipped_with_a_warning(tmp_path):
    path = tmp_path / "t.jsonl"
    write(path, HEADER, QUEUED, END[:20], newline=False)
    trace = Trace.load(path)
    assert trace.calls[1].status == "pending"
    assert len(trace.warnings) == 1 and "truncated last line" in trace.warnings[0]


@pytest.mark.parametrize(
    ("lines", "match"),
    [
        (["not json at all"], "first line is not JSON"),
        ([QUEUED], "does not start with a header"),
        ([HEADER.replace('"format":1', '"format":99')], "format 99"),
        ([HEADER, "{broken", QUEUED], "line 2 is not a corps trace event"),
        ([HEADER, json.dumps(dict(type="end", call="x"))], "line 2"),
    ],
)
def test_bad_files_give_one_clear_error(tmp_path, lines, match):
    path = tmp_path / "t.jsonl"
    write(path, *lines)
    with pytest.raises(TraceError, match=match):
        Trace.load(path)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(TraceError, match="no trace file"):
        Trace.load(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(TraceError, match="no complete header"):
        Trace.load(tmp_path / "empty.jsonl")


def test_unknown_event_types_from_newer_versions_are_skipped(tmp_path):
    path = tmp_path / "t.jsonl"
    write(path, HEADER, json.dumps(dict(type="hologram", t=1.0)), QUEUED)
    trace = Trace.load(path)
    assert 1 in trace.calls and "unknown event" in trace.warnings[0]


def test_follow_reads_what_is_appended_and_waits_for_whole_lines(tmp_path):
    path = tmp_path / "t.jsonl"
    write(path, HEADER, QUEUED, END[:15], newline=False)
    trace = Trace.load(path, follow=True)
    assert trace.calls[1].status == "pending" and trace.warnings == []
    with path.open("a") as f:
        f.write(END[15:] + "\n")
    assert trace.update() == 1
    assert trace.calls[1].status == "ok"
    with path.open("a") as f:
        f.write(json.dumps(dict(type="closed", t=1.0)) + "\n")
    trace.update()
    assert trace.closed


def test_a_real_trace_loads(traces):
    trace = Trace.load(traces["debate"])
    assert trace.closed and trace.header.mode == "choreographed"
    assert all(c.end is not None for c in trace.calls.values())
    for mid, msg in trace.messages.items():
        assert trace.producer(mid).end.message == mid
        assert trace.text(mid) is not None and msg.tokens > 0


def test_names_shorten_pattern_agents():
    one = Names(["debate-1a2b3c4d-alice", "debate-1a2b3c4d-bob", None])
    assert one("debate-1a2b3c4d-alice") == "alice" and one(None) == "(engine)"
    two = Names(["debate-1a2b3c4d-alice", "debate-99999999-alice"])
    assert two("debate-99999999-alice") == "99999999/alice"
    assert one("plain") == "plain"


def test_a_patterns_stages_are_in_its_trace(traces):
    """Patterns say which round they are in; the trace keeps it for viewers."""
    trace = Trace.load(traces["debate"])
    names = [s.name for s in trace.stages]
    assert names[0] == "round 1 of 2"
    assert any(n.startswith("round 1 of") and "affirmative" in n for n in names)
    assert len({s.run for s in trace.stages}) == 1
