"""`corps run --live`: what the run is doing, from the first moment to the last.

A headline (the pattern and its inputs) and a status line (loading the model,
then the stage each workflow announced) show at once, before the model has
loaded; then one panel per active agent streams its tokens, and a footer gives
store occupancy, batch size, queue depth and tokens per second. When the run
ends the last frame stays on screen: each agent's last output and the totals.

The view is a sink on the engine's recorder (with per-token events): sinks only
append to small in-memory records, and a task on the event loop redraws at most
`HZ` times a second, so a run is not slowed by drawing.
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

from corps.engine.trace.events import CallEnd, CallQueued, Stage, Step, Token
from corps.engine.trace.reader import Names

HZ = 2  # redraws per second, at most
SHOWN = 8  # agent panels at most
TAIL = 240  # characters of each running call shown
RATE_WINDOW = 2.0  # seconds of tokens the tok/s figure averages over


@dataclass
class _Call:
    agent: str | None
    kind: str
    tokens: list[int] = field(default_factory=list)


class LiveView:
    """`view.run()` redraws until cancelled; `attach(engine)` once the engine is open.

    `headline` says what runs (pattern and inputs); `status` what is happening
    before the first stage (e.g. "loading smollm2-135m...")."""

    def __init__(self, console: Console, headline: str = "", status: str = "") -> None:
        self.console = console
        self.headline = headline
        self.status = status
        self.calls: dict[int, _Call] = {}
        self.last: dict[str | None, str] = {}  # agent -> text of its last finished call
        self.stages: dict[str, str] = {}  # run -> the stage it announced last
        self.step: Step | None = None
        self.token_times: deque[float] = deque()  # when each recent token arrived
        self.tokens = 0
        self.finished = 0
        self.started = time.perf_counter()
        self.ended: float | None = None
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
            self.tokens += 1
            self.token_times.append(time.perf_counter())
        elif isinstance(event, CallQueued):
            self.calls[event.call] = _Call(event.agent, event.kind)
        elif isinstance(event, CallEnd):
            call = self.calls.pop(event.call, None)
            self.finished += 1
            if call is not None and call.tokens:
                self.last[call.agent] = self._text(call.tokens)
        elif isinstance(event, Stage):
            self.stages[event.run] = event.name
        elif isinstance(event, Step):
            self.step = event

    def done(self) -> None:
        """The run is over: the next frame is the last, and stays."""
        self.ended = time.perf_counter()
        self.calls.clear()

    def rate(self, now: float | None = None) -> float:
        """Tokens per second over the last RATE_WINDOW seconds (or since the first)."""
        now = time.perf_counter() if now is None else now
        times = self.token_times
        while times and now - times[0] > RATE_WINDOW:
            times.popleft()
        if not times:
            return 0.0
        return len(times) / max(now - times[0], 1 / HZ)

    def _text(self, tokens: list[int]) -> str:
        text = self._tokenizer.decode(tokens[-96:], skip_special_tokens=True)
        return text[-TAIL:].replace("\n", " ⏎ ")

    # ---- drawing ----

    def render(self) -> Group:
        names = Names([c.agent for c in self.calls.values()] + list(self.last))
        parts: list = []
        if self.headline:
            parts.append(Text(self.headline, style="bold"))
        parts.append(self._status())
        panels = self._running(names) if self.ended is None else self._outputs(names)
        if panels:
            parts.append(Columns(panels))
        parts.append(self._footer())
        return Group(*parts)

    def _status(self) -> Text:
        if self.ended is not None:
            return Text(f"finished in {self.ended - self.started:.1f} s", style="green")
        if self.stages:
            shown = list(self.stages.items())[-3:]
            several = len(self.stages) > 1
            line = "   ".join(f"{run}: {st}" if several else st for run, st in shown)
            more = f"   (+{len(self.stages) - 3} runs)" if len(self.stages) > 3 else ""
            return Text(f"stage: {line}{more}", style="cyan")
        return Text(self.status or "starting…", style="cyan")

    def _running(self, names: Names) -> list:
        active: dict[str | None, list[tuple[int, _Call]]] = {}
        for cid, call in self.calls.items():
            active.setdefault(call.agent, []).append((cid, call))
        panels: list = []
        for agent, calls in list(active.items())[:SHOWN]:
            body = Text()
            for cid, call in calls:
                if body:
                    body.append("\n")
                body.append(f"c{cid} ", style="dim")
                if call.kind == "prefill" or not call.tokens:
                    body.append(f"{call.kind}…", style="yellow")
                else:
                    body.append(self._text(call.tokens))
            title = f"{names(agent)} ({len(calls)} running)"
            panels.append(Panel(body, title=title, width=self._panel_width(), height=6))
        if len(active) > SHOWN:
            panels.append(Text(f"+{len(active) - SHOWN} more agents running", style="dim"))
        return panels

    def _outputs(self, names: Names) -> list:
        """The final frame: each agent's last output."""
        return [
            Panel(Text(text), title=f"{names(agent)} (last output)", width=self._panel_width())
            for agent, text in list(self.last.items())[:SHOWN]
        ]

    def _panel_width(self) -> int:
        cols = max(1, min(3, self.console.width // 40))
        return max(30, self.console.width // cols - 1)

    def _footer(self) -> Text:
        s = self.step
        elapsed = (self.ended or time.perf_counter()) - self.started
        if self.ended is not None:
            mean = self.tokens / elapsed if elapsed > 0 else 0.0
            speed = f"{self.tokens} tokens, {mean:.0f} tok/s overall"
        else:
            speed = f"{self.rate():.0f} tok/s"
        if s is None:
            return Text(f"store -  ·  batch -  ·  queue -  ·  {speed}", style="dim")
        share = s.store_used / s.capacity if s.capacity else 0.0
        return Text(
            f"store {s.store_used}/{s.capacity} tokens ({share:.0%})  ·  batch {s.calls}  ·  "
            f"queue {s.queue}  ·  {speed}  ·  {self.finished} calls done",
            style="bold",
        )

    async def run(self) -> None:
        """Redraw at most HZ times a second until cancelled; the last frame stays."""
        with Live(self.render(), console=self.console, auto_refresh=False) as live:
            try:
                while True:
                    live.update(self.render(), refresh=True)
                    await anyio.sleep(1 / HZ)
            finally:
                live.update(self.render(), refresh=True)
