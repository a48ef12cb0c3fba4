"""Building an engine call's trace events from its job, call and message (event loop only)."""

from __future__ import annotations

import time

from pydantic import BaseModel

from corps.cache.messages import MessageTable
from corps.engine.errors import EngineClosed
from corps.engine.sched.job import Job
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


def queued_event(rec: Recorder, job: Job) -> CallQueued:
    req = job.request
    sampling = getattr(req, "sampling", None)
    return CallQueued(
        t=rec.rel(job.submitted),
        call=job.id,
        agent=req.owner,
        kind=_kind(req),
        parents=[p.id for p in req.parents],
        offsets=None if req.offsets is None else list(req.offsets),
        max_tokens=None if sampling is None else sampling.max_tokens,
        workflow=job.workflow.name if job.workflow is not None else None,
        group=job.group,
        objective=job.objective,
        critical=job.critical,
    )


def end_events(rec: Recorder, table: MessageTable, job: Job) -> list[BaseModel]:
    """The call's `CallEnd`, preceded by its message (and text) if it made one."""
    req, call, now = job.request, job.call, time.perf_counter()
    if job.cancelled and (job.error is None or isinstance(job.error, EngineClosed)):
        status, error = "cancelled", None  # its waiter left (the shutdown came after)
    elif job.error is not None:
        status, error = "error", f"{type(job.error).__name__}: {job.error}"
    elif job.handle is None:
        status, error = "cancelled", None
    else:
        status, error = "ok", None
    out: list[BaseModel] = []
    end = CallEnd(
        t=rec.rel(now),
        call=job.id,
        agent=req.owner,
        kind=_kind(req),
        status=status,
        error=error,
        parents=[p.id for p in req.parents],
        admitted=rec.rel(job.admitted),
        first_token=rec.rel(job.first_token),
        ttft_s=None if job.first_token is None else job.first_token - job.submitted,
        decode_s=None if job.first_token is None else now - job.first_token,
    )
    if call is not None:
        end = end.model_copy(
            update=dict(
                parents=list(call.plan.parents),
                offsets=list(call.plan.parent_offsets),
                new_offset=call.plan.offset,
                encoded=call.encoded,
                reused=call.reused,
                repaired=call.repaired,
                repair=str(call.repair.policy) if call.repair is not None else call.repair_read,
                generated=len(call.generated),
            )
        )
    if job.handle is not None:
        msg = table.get(job.handle.id)
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
                call=job.id,
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
