"""The live view (corps.view.live): bookkeeping from events, panels and footer."""

from __future__ import annotations

import io

import anyio
import pytest
from rich.console import Console

from corps.engine.trace.events import Stage
from corps.view.live import LiveView

from conftest import open_tiny


def text_of(renderable, width: int = 120) -> str:
    console = Console(record=True, width=width, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


async def test_panels_stream_running_calls_and_the_footer_counts(tiny_dirs):
    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    view = LiveView(console)
    seen: list[str] = []
    async with open_tiny(tiny_dirs, "llama") as engine:
        view.attach(engine)
        q = await engine.prefill("hello")

        def peek(event) -> None:  # after the view's own sink: what it would draw now
            if event.type == "token" and len(seen) < 3:
                seen.append(text_of(view.render()))

        engine.recorder.add(peek, tokens=True)
        await engine.decode(parents=[q], max_tokens=4, ignore_eos=True, owner="alice")
        view.detach(engine)
    assert any("alice (1 running)" in s for s in seen)
    assert all(" 0 tok/s" not in s for s in seen[1:])  # tokens are arriving
    view.done()
    final = text_of(view.render())
    assert "finished in" in final and "alice (last output)" in final  # the last frame
    assert "2 calls done" in final and "store" in final and "batch" in final
    assert "tok/s overall" in final
    assert view.last["alice"]


async def test_run_redraws_until_cancelled_and_shows_what_runs_from_the_start():
    console = Console(file=io.StringIO(), force_terminal=True, width=100)
    view = LiveView(console, "debate  ·  question='x'", status="loading smollm2-135m…")
    async with anyio.create_task_group() as tg:
        tg.start_soon(view.run)
        await anyio.sleep(0.6)
        tg.cancel_scope.cancel()
    drawn = console.file.getvalue()
    assert "debate" in drawn and "loading smollm2-135m" in drawn


def test_stages_show_per_run():
    view = LiveView(Console(file=io.StringIO()))
    view.sink(Stage(run="debate-1a2b3c4d", name="round 2 of 3 · affirmative"))
    assert "stage: round 2 of 3 · affirmative" in text_of(view.render())
    view.sink(Stage(run="debate-99999999", name="round 1 of 3"))
    both = text_of(view.render())
    assert "debate-1a2b3c4d: round 2 of 3" in both and "debate-99999999: round 1" in both


def test_the_rate_counts_the_tokens_of_the_last_seconds():
    view = LiveView(Console(file=io.StringIO()))
    view.token_times.extend([10.0, 10.1, 10.2, 10.3, 10.4, 10.5])
    assert view.rate(now=10.5) == pytest.approx(6 / 0.5)
    assert view.rate(now=20.0) == 0.0  # nothing in the window: it drains
