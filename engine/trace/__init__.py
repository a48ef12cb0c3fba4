"""Traces: typed events of what an engine and its agents did, and their readers.

Owns the events and the recorder that writes them as JSON lines (`events`),
reading a trace file (`reader`), merging several engines' traces (`merge`),
a trace as OpenTelemetry GenAI spans (`spans`) and sending those to a
collector (`exporter`). Imports nothing of the engine but the shared
modules, so the trace viewer loads without torch.
"""
