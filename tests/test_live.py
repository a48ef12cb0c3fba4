"""The live view (corps.cli.live): bookkeeping from events, panels and footer."""

from __future__ import annotations

import io

import anyio
from rich.console import Console

from corps.cli.live import LiveView

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
    final = text_of(view.render())
    assert "waiting for calls" in final  # nothing running any more
    assert "2 calls done" in final and "store" in final and "batch" in final
    assert view.last["alice"]  # its text is kept for the record


async def test_run_redraws_until_cancelled(tiny_dirs):
    console = Console(file=io.StringIO(), force_terminal=True, width=100)
    view = LiveView(console)
    async with anyio.create_task_group() as tg:
        tg.start_soon(view.run)
        await anyio.sleep(0.6)
        tg.cancel_scope.cancel()
    assert "waiting for calls" in console.file.getvalue()
