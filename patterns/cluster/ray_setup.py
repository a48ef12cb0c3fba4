"""Ray for a cluster: imported with a clear error when it is missing, a local instance
started quietly, a head checked reachable before `ray.init` waits on it."""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Iterator
from typing import Any

from corps.patterns.cluster.errors import INSTALL, ClusterError, RayMissing

RAY_INIT = dict(include_dashboard=False, log_to_driver=False, configure_logging=False,
                 namespace="corps")  # fmt: skip


def start_local_ray(num_cpus: int) -> None:
    """Start a local Ray instance in this process, as a cluster does without an address
    (no dashboard; workers' logs stay in Ray's log directory)."""
    ray = import_ray()
    with _quiet("ray._private.authentication"):  # says it secured the local instance
        ray.init(num_cpus=num_cpus, **RAY_INIT)


@contextlib.contextmanager
def _quiet(logger: str) -> Iterator[None]:
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RayMissing(f"running on workers needs Ray: {INSTALL}") from None
    return ray


def check_reachable(address: str) -> None:
    """Fail in seconds, not minutes, on an address nothing listens at (Ray itself
    retries for a long time)."""
    if address == "auto":
        return
    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ClusterError(f"bad Ray address {address!r}: give HOST:PORT, ray://HOST:PORT or auto")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as exc:
        raise ClusterError(f"no Ray cluster answers at {address}: {exc}") from None
