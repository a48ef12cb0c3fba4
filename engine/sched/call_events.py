"""Building an engine call's trace events from its record and message (event loop only)."""

from __future__ import annotations

import time

from pydantic import BaseModel

from corps.cache.messages import MessageTable
from corps.engine.errors import EngineClosed
from corps.engine.exec.call import Call
from corps.engine.trace.events import (
    CallEnd,
    CallQueued,
    MessageMade,
    Recorder,
    Text,
    visibility_name,
)


def _kind(request) -> str:
    return "decode" if hasattr(request, "sampling") else "prefill"


def queued_event(rec: Recorder, call: Call) -> CallQueued:
    req = call.request
    sampling = getattr(req, "sampling", None)
    return CallQueued(
        t=rec.rel(call.submitted),
        call=call.id,
        agent=req.owner,
        kind=_kind(req),
        parents=[p.id for p in req.parents],
        offsets=None if req.offsets is None else list(req.offsets),
        max_tokens=None if sampling is None else sampling.max_tokens,
        workflow=call.workflow.name if call.workflow is not None else None,
        group=call.group,
        objective=call.objective,
        critical=call.critical,
    )


def end_events(rec: Recorder, table: MessageTable, call: Call) -> list[BaseModel]:
    """The call's `CallEnd`, preceded by its message (and text) if it made one."""
    req, plan, now = call.request, call.plan, time.perf_counter()
    if call.cancelled and (call.error is None or isinstance(call.error, EngineClosed)):
        status, error = "cancelled", None  # its waiter left (the shutdown came after)
    elif call.error is not None:
        status, error = "error", f"{type(call.error).__name__}: {call.error}"
    elif call.handle is None:
        status, error = "cancelled", None
    else:
        status, error = "ok", None
    out: list[BaseModel] = []
    end = CallEnd(
        t=rec.rel(now),
        call=call.id,
        agent=req.owner,
        kind=_kind(req),
        status=status,
        error=error,
        parents=[p.id for p in req.parents],
        admitted=rec.rel(call.admitted),
        first_token=rec.rel(call.first_token),
        ttft_s=None if call.first_token is None else call.first_token - call.submitted,
        decode_s=None if call.first_token is None else now - call.first_token,
    )
    if plan is not None:
        end = end.model_copy(
            update=dict(
                parents=list(plan.parents),
                offsets=list(plan.parent_offsets),
                new_offset=plan.offset,
                encoded=call.encoded,
                reused=call.reused,
                repaired=call.repaired,
                repair=str(call.repair.policy) if call.repair is not None else call.repair_read,
                generated=len(call.generated),
            )
        )
    if call.handle is not None:
        msg = table.get(call.handle.id)
        out.append(
            MessageMade(
                t=end.t,
                id=msg.id,
                role=msg.role,
                kind=msg.kind,
                owner=msg.owner,
                visibility=visibility_name(msg.visibility),
                parents=list(msg.parents),
                offsets=list(msg.parent_offsets),
                offset=msg.offset,
                tokens=len(msg.tokens),
                sources=sorted(msg.sources),
                call=call.id,
            )
        )
        out.append(Text(t=end.t, id=msg.id, text=msg.text))
        update = dict(
            message=msg.id,
            encoded=msg.figures.tokens_encoded,
            reused=msg.figures.tokens_reused,
        )
        end = end.model_copy(update=update)
    out.append(end)
    return out
