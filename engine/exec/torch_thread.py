"""The one thread that runs corps' torch compute in a process.

Why one: torch's CPU kernels parallelise with OpenMP, and libgomp gives every
thread that enters a parallel region a team of its own, alive as long as that
thread. Once the process holds more OpenMP threads than cores, libgomp stops
spinning at its barriers (it "throttles" them), so every parallel op of every
forward pays a sleep and a wake-up. Measured on 2 cores: a lone decode of the
default model went from 25 to 50 ms a step for as long as a second team's
thread lived. Three ways corps used to leave a second team behind: an engine
loaded on the caller's thread (`Engine.load`) and stepped on a worker thread;
steps hopping between anyio's worker threads once user code ran in them too;
the constraint-mask thread filling a large bitmask. So every engine of the
process loads and steps here, one call after another: one team, however many
engines, callers and threads there are around them.

The thread starts on first use and ends after `idle_s` seconds without work
(its team with it), so a process that stops using corps keeps no idle workers.
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

import anyio
import anyio.to_thread

T = TypeVar("T")

#: Seconds without work after which the thread ends (a later call starts a new one).
IDLE_S = 10.0


class TorchThread:
    """A thread that runs the functions given to it one at a time, in order."""

    def __init__(self, name: str = "corps-torch", idle_s: float = IDLE_S) -> None:
        self.name = name
        self.idle_s = idle_s
        self._jobs: queue.SimpleQueue[tuple[Future, Callable, tuple]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def ident(self) -> int | None:
        """The running thread's `threading.get_ident()`; None while none runs."""
        thread = self._thread
        return thread.ident if thread is not None else None

    @property
    def waiting(self) -> bool:
        """Whether work is queued for the thread (another engine's step, a load)."""
        return not self._jobs.empty()

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Queue `fn(*args)`; its future holds the result or the exception. It runs in
        a copy of the caller's context, as with `anyio.to_thread.run_sync`: context
        variables set by the caller (torch's config patches among them) hold there."""
        future: Future[T] = Future()
        self._put(future, contextvars.copy_context().run, (fn, *args))
        return future

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on this thread, blocking the caller until it returns (or raises).
        Called from this thread itself, it runs at once."""
        if threading.current_thread() is self._thread:
            return fn(*args)
        return self.submit(fn, *args).result()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """From an event loop: `fn(*args)` on this thread while the loop runs other
        tasks. As with `anyio.to_thread.run_sync`, the caller waits for it to return
        even when cancelled: the work is never abandoned half done. This thread never
        waits on the loop (a loop blocked in `call` cannot deadlock it): on asyncio
        the result is handed over with the loop's thread-safe callback, on another
        backend an anyio worker waits on it (one more thread hop)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not asyncio
            return await anyio.to_thread.run_sync(self.call, fn, *args)
        future = asyncio.wrap_future(self.submit(fn, *args), loop=loop)
        with anyio.CancelScope(shield=True):
            return await future

    def _put(self, future: Future, fn: Callable, args: tuple) -> None:
        with self._lock:
            self._jobs.put((future, fn, args))
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
                self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                future, fn, args = self._jobs.get(timeout=self.idle_s)
            except queue.Empty:
                with self._lock:  # no job can be queued for this thread once it is gone
                    if self._jobs.empty():
                        self._thread = None
                        return
                continue
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # the caller gets it, the thread goes on
                future.set_exception(exc)
            # while it waits for the next job, the thread keeps no result alive (a
            # message's handle in it would outlive every other reference to it)
            del future, fn, args


#: The process's torch thread: every engine loads and steps on it.
TORCH = TorchThread()
