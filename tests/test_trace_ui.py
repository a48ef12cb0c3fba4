"""corps.view.app: the Textual trace app, driven headless with its pilot."""

from __future__ import annotations

import shutil

from textual.widgets import DataTable, Static, TabbedContent

from corps import view as tv
from corps.engine.trace.reader import Trace
from corps.view.app import TraceApp


def shown(app: TraceApp, widget_id: str) -> str:
    """The plain text a Static shows now, rendered at 200 columns."""
    from io import StringIO

    from rich.console import Console

    console = Console(file=StringIO(), width=200, record=True)
    console.print(app.query_one(f"#{widget_id}", Static).content)
    return console.export_text()


async def test_open_a_trace_move_to_a_call_and_read_its_detail(traces):
    trace = Trace.load(traces["tree_of_thoughts"])
    app = TraceApp(trace)
    async with app.run_test(size=(160, 50)) as pilot:
        table = app.query_one("#calls", DataTable)
        assert table.row_count == len(trace.calls)
        first = tv.calls(trace)[0]
        assert app.selected == first.id and f"call {tv.cid(first.id)}" in shown(app, "call")
        await pilot.press("down", "down", "down")
        third = tv.calls(trace)[3]
        assert app.selected == third.id
        detail = shown(app, "call")
        assert f"call {tv.cid(third.id)}" in detail and "position" in detail  # its picture
        for mid in third.end.parents:  # each parent's text, whole
            assert f"m{mid} @" in detail
        assert "timeline" in shown(app, "timeline")


async def test_filter_by_agent_and_clear(traces):
    trace = Trace.load(traces["tree_of_thoughts"])
    app = TraceApp(trace)
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.press("slash", *"voter", "enter")
        table = app.query_one("#calls", DataTable)
        voters = tv.calls(trace, tv.Filter(agent="voter"))
        assert table.row_count == len(voters) > 0
        assert app.selected in {c.id for c in voters}
        await pilot.press("slash", "escape")
        assert table.row_count == len(trace.calls)


async def test_the_other_tabs_hold_totals_graph_and_problems(traces):
    app = TraceApp(Trace.load(traces["prisoners_dilemma"]))
    async with app.run_test(size=(160, 50)) as pilot:
        tabs = app.query_one(TabbedContent)
        assert app.stale == {"tab-totals", "tab-messages", "tab-problems"}  # not drawn yet
        for tab in ("tab-totals", "tab-messages", "tab-problems"):
            tabs.active = tab
            await pilot.pause()
        assert app.stale == set()
        assert "critical path" in shown(app, "totals")
        assert "left out" in shown(app, "totals")  # the steps table, below the totals
        assert "slowest 1 of 1" in shown(app, "totals")  # and the workflows table
        assert "message graph" in shown(app, "graph")
        assert "leak" in shown(app, "problems")


async def test_follow_a_growing_file(traces, tmp_path):
    """A run still writing: the app shows the calls read so far, then the rest as
    they are appended."""
    source = traces["debate"].read_bytes().splitlines(keepends=True)
    path = tmp_path / "growing.jsonl"
    half = len(source) // 2
    path.write_bytes(b"".join(source[:half]))
    trace = Trace.load(path, follow=True)
    app = TraceApp(trace, follow=True)
    async with app.run_test(size=(160, 50)) as pilot:
        table = app.query_one("#calls", DataTable)
        before = table.row_count
        with path.open("ab") as f:
            f.writelines(source[half:])
        assert app.poll() > 0  # what the timer does twice a second
        await pilot.pause()
        full = Trace.load(traces["debate"])
        assert before < table.row_count == len(full.calls)
        assert "tab-totals" in app.stale  # hidden tabs wait to be opened
        app.query_one(TabbedContent).active = "tab-totals"
        await pilot.pause()
        total = next(x.split() for x in shown(app, "totals").splitlines() if " all " in x)
        assert total[1] == str(len(full.calls))  # the "all" row counts every call read
        assert "following" in app.sub_title
        await pilot.press("f")
        assert not app.follow and "following" not in app.sub_title


def test_the_cli_opens_the_app(traces, monkeypatch, tmp_path):
    """`corps trace ui FILE` loads the file and runs the app (run stubbed: no TTY)."""
    from typer.testing import CliRunner

    from corps.cli.app import app as cli

    opened = []
    monkeypatch.setattr(TraceApp, "run", lambda self: opened.append(self.trace))
    path = tmp_path / "t.jsonl"
    shutil.copy(traces["debate"], path)
    result = CliRunner().invoke(cli, ["trace", "ui", str(path)])
    assert result.exit_code == 0, result.output
    assert len(opened) == 1 and opened[0].path == path
    missing = CliRunner().invoke(cli, ["trace", "ui", str(tmp_path / "none.jsonl")])
    assert missing.exit_code == 2 and "no trace file" in missing.output
