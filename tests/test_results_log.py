"""patterns/cluster/results_log.py: one line per input id, kept across an interrupted run."""

from __future__ import annotations

import json

from corps.patterns.cluster.results_log import ResultLog


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_lines_are_written_as_they_come_and_a_fresh_log_starts_empty(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_text("old\n")
    with ResultLog(path) as log:
        log.write({"id": 0, "index": 0, "result": {"answer": "4"}})
        assert _lines(path) == [{"id": 0, "index": 0, "result": {"answer": "4"}}]  # flushed
        log.write({"id": "b", "index": 1, "error": "boom"})
    assert log.done == {0} and len(_lines(path)) == 2


def test_resume_keeps_results_drops_failures_and_a_torn_line(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_text(
        json.dumps({"id": 0, "result": {}})
        + "\n"
        + json.dumps({"id": "x", "error": "worker died"})
        + "\n"
        + json.dumps({"id": 2, "result": {}})
        + "\n"
        + '{"id": 3, "res'  # interrupted mid-write
    )
    with ResultLog(path, resume=True) as log:
        assert log.done == {0, 2} and log.dropped == 2
        log.write({"id": "x", "result": {}})
        log.write({"id": 3, "result": {}})
    assert [x["id"] for x in _lines(path)] == [0, 2, "x", 3]


def test_resume_without_a_file_starts_one(tmp_path):
    with ResultLog(tmp_path / "new.jsonl", resume=True) as log:
        assert log.done == set()
    assert (tmp_path / "new.jsonl").read_text() == ""
