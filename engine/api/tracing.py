"""An engine's trace sinks: the header of its trace files, and its live OTel spans."""

from __future__ import annotations

from corps.engine.config import EngineConfig
from corps.engine.exec.executor import Executor
from corps.engine.trace.events import Header, Recorder, version
from corps.engine.trace.exporter import LiveSpans


def trace_header(executor: Executor, model: str, policy: str, started_unix: float) -> Header:
    """The header of a trace file of this engine (its recorder started at `started_unix`)."""
    return Header(
        corps=version(),
        model=model,
        mode=executor.mode,
        dtype=executor.precision,
        device=str(executor.device),
        started_unix=started_unix,
        policy=policy,
    )


def live_spans(cfg: EngineConfig, executor: Executor, recorder: Recorder) -> LiveSpans:
    """Send the engine's calls as OTel spans to `cfg.otel` as they end (`--otel-endpoint`)."""
    sink = LiveSpans(
        cfg.otel,
        model=cfg.model,
        mode=executor.mode,
        started_unix=recorder.started_unix,
        protocol=cfg.otel_protocol,
    )
    recorder.add(sink)
    return sink
