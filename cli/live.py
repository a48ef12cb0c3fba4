"""`corps run --live`: one panel per active agent streaming its tokens, and a footer.

The view is a sink on the engine's recorder (with per-token events): sinks only
append to small in-memory records, and a task on the event loop redraws at most
`HZ` times a second, so a run is not slowed by drawing. The footer shows store
occupancy, batch size and queue depth from the last step, and tokens per second
over the last few seconds.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import anyio
from rich.columns import Columns
from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.text import Text

from corps.engine.trace import CallEnd, CallQueued, Step, Token
from corps.engine.trace_file import Names

HZ = 2  # redraws per second, at most
SHOWN = 8  # agent panels at most
TAIL = 240  # characters of each running call shown


@dataclass
class _Call:
    agent: str | None
    kind: str
    tokens: list[int] = field(default_factory=list)
    done: bool = False


class LiveView:
    """Attach with `view.attach(engine)`, then run `await view.run()` until cancelled."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.calls: dict[int, _Call] = {}
        self.last: dict[str | None, str] = {}  # agent -> text of its last finished call
        self.step: Step | None = None
        self.sampled: deque[tuple[float, int]] = deque()  # (time, tokens) of recent steps
        self.finished = 0
        self._tokenizer = None

    def attach(self, engine) -> None:
        self._tokenizer = engine.tokenizer
        engine.recorder.add(self.sink, tokens=True)

    def detach(self, engine) -> None:
        engine.recorder.remove(self.sink)

    def sink(self, event) -> None:
        """Runs on the event loop for every event: bookkeeping only, no drawing."""
        if isinstance(event, Token):
            call = self.calls.get(event.call)
            if call is not None:
                call.tokens.append(event.token)
        elif isinstance(event, CallQueued):
            self.calls[event.call] = _Call(event.agent, event.kind)
        elif isinstance(event, CallEnd):
            call = self.calls.pop(event.call, None)
            self.finished += 1
            if call is not None and call.tokens:
                self.last[call.agent] = self._text(call.tokens)
        elif isinstance(event, Step):
            self.step = event
            now = time.perf_counter()
            self.sampled.append((now, event.sampled))
            while self.sampled and now - self.sampled[0][0] > 3.0:
                self.sampled.popleft()

    def _text(self, tokens: list[int]) -> str:
        text = self._tokenizer.decode(tokens[-96:], skip_special_tokens=True)
        return text[-TAIL:].replace("\n", " ⏎ ")

    def render(self) -> Group:
        names = Names([c.agent for c in self.calls.values()] + list(self.last))
        active: dict[str | None, list[tuple[int, _Call]]] = {}
        for cid, call in self.calls.items():
            active.setdefault(call.agent, []).append((cid, call))
        panels = []
        for agent, calls in list(active.items())[:SHOWN]:
            body = Text()
            for cid, call in calls:
                if body:
                    body.append("\n")
                body.append(f"#{cid} ", style="dim")
                if call.kind == "prefill" or not call.tokens:
                    body.append(f"{call.kind}…", style="yellow")
                else:
                    body.append(self._text(call.tokens))
            title = f"{names(agent)} ({len(calls)} running)"
            panels.append(Panel(body, title=title, width=self._panel_width(), height=6))
        if len(active) > SHOWN:
            panels.append(Text(f"+{len(active) - SHOWN} more agents running", style="dim"))
        if not panels:
            panels.append(Text("waiting for calls…", style="dim"))
        return Group(Columns(panels), self._footer())

    def _panel_width(self) -> int:
        cols = max(1, min(3, self.console.width // 40))
        return max(30, self.console.width // cols - 1)

    def _footer(self) -> Text:
        s = self.step
        tps = 0.0
        if len(self.sampled) > 1:
            span = self.sampled[-1][0] - self.sampled[0][0]
            tps = sum(n for _, n in list(self.sampled)[1:]) / span if span > 0 else 0.0
        if s is None:
            return Text("store -  ·  batch -  ·  queue -  ·  0 tok/s", style="dim")
        share = s.store_used / s.capacity if s.capacity else 0.0
        return Text(
            f"store {s.store_used}/{s.capacity} tokens ({share:.0%})  ·  batch {s.calls}  ·  "
            f"queue {s.queue}  ·  {tps:.0f} tok/s  ·  {self.finished} calls done",
            style="bold",
        )

    async def run(self) -> None:
        """Redraw at most HZ times a second until cancelled (then draw once more)."""
        with Live(self.render(), console=self.console, auto_refresh=False, transient=True) as live:
            try:
                while True:
                    await anyio.sleep(1 / HZ)
                    live.update(self.render(), refresh=True)
            finally:
                live.update(Group(), refresh=True)
