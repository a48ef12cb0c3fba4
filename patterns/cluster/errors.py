"""What a cluster can fail with: Ray missing, a worker that would not start, a bad
address or input (all `CorpsError`s, one line each)."""

from __future__ import annotations

from corps.cache.errors import CorpsError

INSTALL = "pip install 'corps[ray]'"


class ClusterError(CorpsError):
    """The cluster could not start or went on without workers (one line says why)."""


class RayMissing(ClusterError):
    """Ray is not installed."""


class WorkerStartFailed(ClusterError):
    """A worker could not build its engine (bad model, no resources, ...)."""
