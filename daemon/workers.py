"""A bounded pool of worker threads, each owning its own interpreters.

Overflow policy: `submit` never blocks (it runs on paho's network thread). When the
queue is full it returns False and the caller answers the request `overloaded`, so
overload is shed explicitly and visibly, never silently.

Interpreters are not thread-safe, so each worker gets a private context (its own
`Model` per model name) built on the caller's thread at `start`, where a bad model
fails start-up instead of a worker dying later. `invoke()` releases the GIL, so N
workers give close to N-fold throughput on N cores.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Callable, Generic, TypeVar

logger = logging.getLogger(__name__)

J = TypeVar("J")
C = TypeVar("C")
_STOP = object()  # sentinel: one per worker, queued behind the remaining work


class WorkerPool(Generic[J, C]):
    """`size` threads pulling jobs from one bounded queue; `process(context, job)` does the work."""

    def __init__(self, size: int, queue_size: int, make_context: Callable[[int], C],
                 process: Callable[[C, J], None], name: str = "worker"):
        self._size = size
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        self._make_context = make_context
        self._process = process
        self._name = name
        self._threads: list[threading.Thread] = []
        self._accepting = False
        self._busy = 0
        self._busy_lock = threading.Lock()

    def start(self) -> None:
        contexts = [self._make_context(i) for i in range(self._size)]
        for i, context in enumerate(contexts):
            # daemon=True so a forced exit (second SIGINT) is never held up by a stuck invoke.
            thread = threading.Thread(target=self._run, args=(context,), name=f"{self._name}-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)
        self._accepting = True

    def submit(self, job: J) -> bool:
        """Queue a job without blocking; False when the queue is full or the pool is stopping."""
        if not self._accepting:
            return False
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            return False
        return True

    @property
    def depth(self) -> int:
        return self._queue.qsize()

    @property
    def busy(self) -> int:
        with self._busy_lock:
            return self._busy

    def _run(self, context: C) -> None:
        while True:
            job = self._queue.get()
            if job is _STOP:
                return
            with self._busy_lock:
                self._busy += 1
            try:
                self._process(context, job)
            except Exception:  # a bug in one job must not kill the worker
                logger.exception("worker failed on a job")
            finally:
                with self._busy_lock:
                    self._busy -= 1

    def stop(self, timeout_s: float) -> bool:
        """Stop intake, let queued and running jobs finish within `timeout_s`; True if all did."""
        self._accepting = False
        deadline = time.monotonic() + timeout_s
        for _ in self._threads:
            self._put_stop(deadline)
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            logger.warning("shutdown: %d job(s) still queued or running after %.1fs (%s)",
                           self.depth + self.busy, timeout_s, ", ".join(alive))
        self._threads = [t for t in self._threads if t.is_alive()]
        return not alive

    def _put_stop(self, deadline: float) -> None:
        try:
            self._queue.put(_STOP, timeout=max(0.0, deadline - time.monotonic()))
        except queue.Full:
            pass  # the drain time is spent; the join below reports what is left

