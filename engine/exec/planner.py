"""Planning a call: framing its tokens, placing its parents, checking it, before any compute.

The `Planner` plans a queued `Call` (`corps.engine.exec.call`) for its request:
its frozen `CallPlan`, what it attends to (context slots at the positions the call
gives them) and what it must encode (its feed). Planning raises on bad input and
touches nothing but the call, so a rejected call leaves the store exactly as it
was.
"""

from __future__ import annotations

from collections.abc import Sequence

from corps.cache.handle import Handle
from corps.cache.messages import Message, MessageTable
from corps.cache.placement import check_limit, place
from corps.engine.errors import InvalidRequest
from corps.engine.exec.call import Call, CallPlan
from corps.engine.request.chat_format import ChatFormat
from corps.engine.request.requests import DecodeRequest, PrefillRequest


class Planner:
    """Plans calls for one engine's format, message table and mode."""

    def __init__(
        self,
        fmt: ChatFormat,
        table: MessageTable,
        *,
        mode: str,
        max_positions: int,
        vocab_size: int,
    ) -> None:
        self.fmt = fmt
        self.table = table
        self.mode = mode
        self.max_positions = max_positions
        self.vocab_size = vocab_size
        self.sink_slots: list[int] = []  # the attention sink every call sees, once encoded

    def _message_tokens(self, content, role: str, frame: bool) -> tuple[list[int], str]:
        if not frame:
            ids = self.fmt.encode(content) if isinstance(content, str) else list(content)
            text = content if isinstance(content, str) else self.fmt.decode(ids)
            return ids, text
        header, footer = self.fmt.frame(role)
        if isinstance(content, str):
            return self.fmt.encode(header + content + footer), content
        ids = list(content)
        head, foot = self.fmt.frame_ids(role)
        return [*head, *ids, *foot], self.fmt.decode(ids)

    def _header_tokens(self, req: DecodeRequest) -> list[int]:
        user = self.fmt.encode(req.header) if isinstance(req.header, str) else list(req.header)
        if not req.frame:
            return user
        return [*self.fmt.frame_ids(req.role)[0], *user]

    def prefill(self, call: Call, req: PrefillRequest) -> None:
        """Plan `call` as the prefill `req` (its request as it runs)."""
        tokens, text = self._message_tokens(req.message, req.role, req.frame)
        self._check_vocab(tokens)
        self._plan(call, req, tokens, text, "prefill")

    def decode(self, call: Call, req: DecodeRequest) -> None:
        """Plan `call` as the decode `req` (its request as it runs)."""
        header = self._header_tokens(req)
        self._check_vocab(header)
        self._check_vocab(list(req.sampling.force))
        self._check_vocab([t for t, _ in req.sampling.logit_bias])
        head, footer = self.fmt.frame_ids(req.role) if req.frame else ((), ())
        frame_len = len(head)
        decode = dict(
            sampling=req.sampling,
            frame_len=frame_len,
            footer=tuple(footer),
            salt=req.cache_salt,
            final=req.final,
        )
        self._plan(call, req, header, "", "decode", **decode)
        call.generator = req.sampling.generator()

    def _plan(self, call: Call, req, tokens: list[int], text: str, kind: str, **decode) -> None:
        parents = [self.live(p) for p in req.parents]
        sink = len(self.fmt.sink)
        placed = place([len(p.tokens) for p in parents], req.offsets, req.new_offset, sink=sink)
        for p, start in zip(parents, placed.starts, strict=True):
            check_limit(start + len(p.tokens) - 1, self.max_positions, f"parent {p.id}")
        ctx_slots, ctx_pos = self.context(parents, placed.starts)
        prompt, starts, offset = list(tokens), placed.starts, placed.new_offset
        feed, feed_start = tokens, offset
        if self.mode != "choreographed":  # baseline and hf render one causal prompt
            prompt = list(self.fmt.sink) + [t for p in parents for t in p.tokens] + tokens
            starts = tuple(_starts(sink, [len(p.tokens) for p in parents]))
            offset = len(prompt) - len(tokens)
            ctx_slots, ctx_pos, feed, feed_start = [], [], prompt, 0
        plan = CallPlan(
            kind=kind,
            role=req.role,
            offset=offset,
            parents=tuple(p.id for p in parents),
            parent_offsets=starts,
            owner=req.owner,
            visibility=req.visibility,
            own=len(tokens),
            prefix=prompt,
            records=tuple(parents),
            **decode,
        )
        end = feed_start + len(feed) + plan.generated_max - 1
        check_limit(end, self.max_positions, f"the new {kind} message")
        call.plan, call.ctx_slots, call.ctx_pos = plan, ctx_slots, ctx_pos
        call.feed, call.feed_start, call.text = feed, feed_start, text

    def context(
        self, parents: Sequence[Message], starts: Sequence[int]
    ) -> tuple[list[int], list[int]]:
        """A choreographed call's context: the sink and its parents' store slots, and
        the positions it gives them (each parent from its start)."""
        ctx_slots: list[int] = list(self.sink_slots)
        ctx_pos: list[int] = list(range(len(ctx_slots)))
        for p, start in zip(parents, starts, strict=True):
            ctx_slots += p.slots
            ctx_pos += range(start, start + len(p.tokens))
        return ctx_slots, ctx_pos

    def _check_vocab(self, tokens: list[int]) -> None:
        vocab = self.vocab_size
        bad = [t for t in tokens if t >= vocab]
        if bad:
            raise InvalidRequest(f"token id {bad[0]} is outside the vocabulary (size {vocab})")

    def live(self, handle: Handle) -> Message:
        """The message a handle names, if its encoding is still there (not freed, or
        freed but pinned by the call being planned); else UnknownHandle / InvalidRequest."""
        if not isinstance(handle, Handle):
            raise InvalidRequest(f"expected a Handle, got {type(handle).__name__}")
        self.table.own(handle)
        msg = self.table.get(handle.id)
        if msg.freed and msg.pins == 0:  # freed and not kept by a queued call: gone
            return self.table.live(handle.id)  # raises, saying so
        return msg


def _starts(sink: int, lengths: list[int]) -> list[int]:
    out, cursor = [], sink
    for n in lengths:
        out.append(cursor)
        cursor += n
    return out
