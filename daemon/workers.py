"""A pool of worker threads that take queued jobs in batches, each worker owning its interpreters.

`submit` never blocks (it runs on paho's network thread) and never refuses for lack of
room: what may queue is decided before, by `admission.Admission` (bytes and predicted
wait), so the queue itself is unbounded here. It returns False only while stopping.

The batch loop follows Ray Serve's `wait_for_batch`: block for the first job, then take
what is queued up to `max_batch`; with `max_delay_s` > 0, wait for more until that
window, measured from the first job's arrival, closes, but never past the earliest deadline in
the batch. An idle queue never waits. When several workers are idle, a worker takes only
its share of what is queued, so a short queue is split rather than served by one.

Interpreters are not thread-safe, so each worker gets a private context (its own
`Model` per model name) built on the caller's thread at `start`, where a bad model fails
start-up instead of a worker dying later. `invoke()` releases the GIL.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from typing import Callable, Generic, Optional, TypeVar

logger = logging.getLogger(__name__)

J = TypeVar("J")
C = TypeVar("C")


class WorkerPool(Generic[J, C]):
    """`size` threads taking batches from one queue; `process(context, jobs)` does the work."""

    def __init__(self, size: int, make_context: Callable[[int], C], process: Callable[[C, list[J]], None],
                 max_batch: int = 1, max_delay_s: float = 0.0,
                 deadline_of: Callable[[J], Optional[float]] = lambda job: None,
                 arrival_of: Optional[Callable[[J], float]] = None, clock: Callable[[], float] = time.monotonic,
                 name: str = "worker"):
        self._size = size
        self._make_context = make_context
        self._process = process
        self._max_batch = max_batch
        self._max_delay = max_delay_s
        self._deadline_of = deadline_of
        self._arrival_of = arrival_of or (lambda job: clock())
        self._clock = clock
        self._name = name
        self._queue: deque[J] = deque()
        self._cond = threading.Condition(threading.Lock())
        self._threads: list[threading.Thread] = []
        self._accepting = True  # until stop(); jobs submitted before start() wait for the workers
        self._closing = False
        self._idle = 0
        self._busy = 0
        self._last_progress = clock()  # a batch taken or finished
        self._next: dict[int, C] = {}  # replacement contexts, taken by each worker before its next batch

    def start(self) -> None:
        contexts = [self._make_context(i) for i in range(self._size)]
        for i, context in enumerate(contexts):
            # daemon=True so a forced exit (second SIGINT) is never held up by a stuck invoke.
            thread = threading.Thread(target=self._run, args=(i, context), name=f"{self._name}-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def replace_contexts(self, make_context: Callable[[int], C]) -> None:
        """Build new contexts here (a failure changes nothing); each worker takes its own before
        its next batch, so a batch in flight finishes on the old context and queued jobs run on the new."""
        contexts = {i: make_context(i) for i in range(self._size)}
        self._make_context = make_context
        self._next.update(contexts)

    def submit(self, job: J) -> bool:
        """Queue a job without blocking; False when the pool is stopping."""
        if not self._accepting:
            return False
        with self._cond:
            self._queue.append(job)
            if self._idle:
                self._cond.notify()
        return True

    @property
    def depth(self) -> int:
        return len(self._queue)

    @property
    def busy(self) -> int:
        return self._busy

    def progressing(self, within_s: float) -> bool:
        """False when there is work but no batch was taken or finished for `within_s` (a wedged worker)."""
        with self._cond:
            if not self._busy and not self._queue:
                return True
            return self._clock() - self._last_progress < within_s

    def take(self) -> Optional[list[J]]:
        """The next batch (blocking for its first job); None once stopping and drained."""
        with self._cond:
            self._idle += 1
            while not self._queue and not self._closing:
                self._cond.wait()
            self._idle -= 1
            if not self._queue:
                return None
            share = math.ceil(len(self._queue) / (self._idle + 1))
            batch = [self._queue.popleft() for _ in range(min(self._max_batch, share))]
            if self._max_delay > 0 and len(batch) < self._max_batch:
                self._fill(batch)
            self._busy += 1
            self._last_progress = self._clock()
            return batch

    def _fill(self, batch: list[J]) -> None:
        """Wait (lock held by the caller, released while waiting) for more jobs until the window closes."""
        close = self._arrival_of(batch[0]) + self._max_delay
        for job in batch:
            close = self._before_deadline(close, job)
        while len(batch) < self._max_batch and not self._closing:
            if self._queue:
                job = self._queue.popleft()
                batch.append(job)
                close = self._before_deadline(close, job)
                continue
            left = close - self._clock()
            if left <= 0 or not self._cond.wait(left):
                return

    def _before_deadline(self, close: float, job: J) -> float:
        deadline = self._deadline_of(job)
        return close if deadline is None else min(close, deadline)

    def _run(self, index: int, context: C) -> None:
        while (batch := self.take()) is not None:
            context = self._next.pop(index, context)
            try:
                self._process(context, batch)
            except Exception:  # a bug in one batch must not kill the worker
                logger.exception("worker failed on a batch of %d", len(batch))
            finally:
                with self._cond:
                    self._busy -= 1
                    self._last_progress = self._clock()

    def stop(self, timeout_s: float) -> bool:
        """Stop intake, let queued and running jobs finish within `timeout_s`; True if all did."""
        self._accepting = False
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            logger.warning("shutdown: %d job(s) still queued or running after %.1fs (%s)",
                           self.depth + self.busy, timeout_s, ", ".join(alive))
        self._threads = [t for t in self._threads if t.is_alive()]
        return not alive
