"""Tool calls streamed as OpenAI chunk deltas (the offer, grammar and parse are the
engine's: `corps.engine.request.tools`)."""

from __future__ import annotations

from corps.engine.request.tools import Call, Offer, parse_calls


class Streamer:
    """A reply's deltas as OpenAI chunk deltas: `{"content": ...}` for content, tool-call
    deltas for calls (the first of each with its index, id, type and name, then
    fragments of its arguments). Fed the reply's text deltas in order; what it
    returns joins to what `offer.parse` makes of the whole text."""

    def __init__(self, offer: Offer) -> None:
        self.offer = offer
        self.text = ""
        self.mode: str | None = None  # "content" or "calls", once `offer.kind` says
        self.calls: list[Call] = []
        self._sent: list[int] = []  # per call: argument characters sent

    def feed(self, delta: str) -> list[dict]:
        if not delta:
            return []
        self.text += delta
        if self.mode is None:
            self.mode = self.offer.kind(self.text)
            if self.mode == "content":  # what was held back, at once
                return [{"content": self.text}]
        if self.mode == "content":
            return [{"content": delta}]
        return self._call_deltas() if self.mode == "calls" else []

    def _call_deltas(self) -> list[dict]:
        _, calls = parse_calls(self.offer.syntax, self.text)
        out = []
        for index, call in enumerate(calls):
            if call.name is None:
                break  # its name is not written yet: nothing to announce
            if index == len(self.calls):
                self.calls.append(call)
                self._sent.append(0)
                head = {"index": index, "id": call.id, "type": "function",
                        "function": {"name": call.name, "arguments": ""}}  # fmt: skip
                out.append({"tool_calls": [head]})
            mine = self.calls[index]
            mine.arguments, mine.complete = call.arguments, call.complete
            more = call.arguments[self._sent[index] :]
            if more:
                self._sent[index] = len(call.arguments)
                out.append({"tool_calls": [{"index": index, "function": {"arguments": more}}]})
        return out
