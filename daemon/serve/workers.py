"""A pool of worker threads that take queued jobs in batches, each worker owning its interpreters.

`submit_many` (a read burst's jobs) never blocks (it runs on paho's network thread) and never refuses for lack of
room: what may queue is decided before, by `admission.Admission` (bytes and predicted
wait), so the queue itself is unbounded here. It returns False only while stopping.

The batch loop follows Ray Serve's `wait_for_batch`: block for the first job, then take
what is queued up to `max_batch`, and no more than the batch can serve before the earliest
deadline in it (`batch_seconds`, the measured batch time); with `max_delay_s` > 0, wait for
more until that window, measured from the first job's arrival, closes, but never past the
earliest deadline in the batch. An idle queue never waits. When several workers are idle, a worker takes only
its share of what is queued, so a short queue is split rather than served by one.

Interpreters are not thread-safe, so each worker gets a private context (its own
`Model` per model name) built on the caller's thread at `start`, where a bad model fails
start-up instead of a worker dying later. `invoke()` releases the GIL.

Adaptive size (an `Autoscaler` with min < max): `start` runs `min` workers, and a control
thread asks the policy (daemon/serve/autoscale.py) on a tick of half `scale_up_wait`, feeding it
the age of the oldest queued job; each batch taken feeds it that batch's oldest wait. To
grow, the control thread builds the new worker's context itself (model load and warm-up,
off the workers' path) and starts it; to shrink, it asks for one retirement, which the
next worker to look for work takes by exiting: after its current batch, never with a job
left behind, since the queue stays with the others. `on_resize` hears every new count.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from itertools import count
from typing import Callable, Generic, Optional, Sequence, TypeVar

from daemon.serve.autoscale import GROW, HOLD, SHRINK, Autoscaler

logger = logging.getLogger(__name__)

J = TypeVar("J")
C = TypeVar("C")

# The control thread decides this often per scale_up_wait: a wait past it is acted on within it.
TICKS_PER_UP_WAIT = 2
MIN_TICK_S = 0.005


class WorkerPool(Generic[J, C]):
    """`size` threads taking batches from one queue; `process(context, jobs)` does the work."""

    def __init__(self, size: int, make_context: Callable[[int], C], process: Callable[[C, list[J]], None],
                 max_batch: int = 1, max_delay_s: float = 0.0,
                 deadline_of: Callable[[J], Optional[float]] = lambda job: None,
                 batch_seconds: Callable[[J, int], float] = lambda job, n: 0.0,
                 arrival_of: Optional[Callable[[J], float]] = None, clock: Callable[[], float] = time.monotonic,
                 name: str = "worker", scaler: Optional[Autoscaler] = None,
                 on_resize: Callable[[int], None] = lambda workers: None):
        """`size` is the fixed size, or the most an adaptive `scaler` (min < max) may grow to.
        `batch_seconds(first, n)`: how long a batch of n led by `first` is expected to take; a batch
        is cut where it would end past the earliest deadline in it."""
        self._size = size
        self._scaler = scaler if scaler is not None and not scaler.fixed else None
        self._on_resize = on_resize
        self._make_context = make_context
        self._process = process
        self._max_batch = max_batch
        self._max_delay = max_delay_s
        self._deadline_of = deadline_of
        self._batch_seconds = batch_seconds
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
        self._slots: set[int] = set()  # context indices of the running workers
        self._count = 0  # running workers less those asked to retire
        self._retire = 0  # retirements asked for and not yet taken
        self._building = threading.Lock()  # one context build at a time: a reload and a growth never mix
        self._control: Optional[threading.Thread] = None
        self._halt = threading.Event()  # ends the control thread
        self.scale_ups = 0
        self.scale_downs = 0

    def start(self) -> None:
        initial = self._scaler.min if self._scaler is not None else self._size
        contexts = [self._make_context(i) for i in range(initial)]
        for i, context in enumerate(contexts):
            self._spawn(i, context)
        self._on_resize(self._count)
        if self._scaler is not None:
            self._control = threading.Thread(target=self._control_loop, name=f"{self._name}-scaler", daemon=True)
            self._control.start()

    def _spawn(self, index: int, context: C) -> None:
        # daemon=True so a forced exit (second SIGINT) is never held up by a stuck invoke.
        thread = threading.Thread(target=self._run, args=(index, context), name=f"{self._name}-{index}", daemon=True)
        with self._cond:
            self._slots.add(index)
            self._count += 1
            self._threads = [t for t in self._threads if t.is_alive()]  # retired workers are gone
            self._threads.append(thread)
        thread.start()

    def replace_contexts(self, make_context: Callable[[int], C]) -> None:
        """Build new contexts here (a failure changes nothing); each worker takes its own before
        its next batch, so a batch in flight finishes on the old context and queued jobs run on the new."""
        with self._building:
            contexts = {i: make_context(i) for i in sorted(self._slots)}
            self._make_context = make_context
            self._next.update(contexts)

    def submit(self, job: J) -> bool:
        """Queue a job without blocking; False when the pool is stopping."""
        return self.submit_many((job,))

    def submit_many(self, jobs: Sequence[J]) -> bool:
        """Queue a read burst's jobs without blocking, in one lock round-trip and one wake-up (of as
        many idle workers as there are jobs, who split them); False when the pool is stopping."""
        if not self._accepting:
            return False
        with self._cond:
            self._queue.extend(jobs)
            if self._idle:
                self._cond.notify(min(self._idle, len(jobs)))
        return True

    @property
    def depth(self) -> int:
        return len(self._queue)

    @property
    def busy(self) -> int:
        return self._busy

    @property
    def size(self) -> int:
        """Workers running now (less any asked to retire)."""
        return self._count

    def scaling(self) -> dict:
        """The size's bounds and how often it changed, for the stats."""
        low = self._scaler.min if self._scaler is not None else self._size
        return {"min": low, "max": self._size, "scale_ups": self.scale_ups, "scale_downs": self.scale_downs}

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
            while not self._queue and not self._closing and not self._retire:
                self._cond.wait()
            self._idle -= 1
            if self._retire:  # this worker retires; the queue stays with the others
                self._retire -= 1
                return None
            if not self._queue:
                return None
            share = math.ceil(len(self._queue) / (self._idle + 1))
            batch = self._cut(min(self._max_batch, share))
            if self._scaler is not None:
                self._scaler.observe(self._clock() - self._arrival_of(batch[0]))
            if self._max_delay > 0 and len(batch) < self._max_batch:
                self._fill(batch)
            self._busy += 1
            self._last_progress = self._clock()
            return batch

    def _cut(self, limit: int) -> list[J]:
        """Up to `limit` queued jobs (lock held), fewer where one more would make the batch end past
        the earliest deadline in it: a deadline is met by serving a smaller batch, not missed by
        waiting for a full one. The first job is taken whatever its deadline (the pipeline answers
        it `expired` if even alone it cannot make it)."""
        queue = self._queue
        first = queue.popleft()
        batch = [first]
        earliest = self._deadline_of(first)
        now = None
        while len(batch) < limit and queue:
            deadline = self._deadline_of(queue[0])
            if deadline is not None and (earliest is None or deadline < earliest):
                earliest = deadline
            if earliest is not None:
                now = self._clock() if now is None else now
                if now + self._batch_seconds(first, len(batch) + 1) > earliest:
                    break
            batch.append(queue.popleft())
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
        with self._cond:  # retired or stopped: its slot is free for a later worker
            self._slots.discard(index)
            self._next.pop(index, None)

    def _control_loop(self) -> None:
        tick = max(MIN_TICK_S, self._scaler.up_wait_s / TICKS_PER_UP_WAIT)
        while not self._halt.wait(tick):
            if self._decide() == GROW:
                self._grow()

    def _decide(self) -> int:
        """Ask the policy (lock held); a shrink is carried out here: one retirement, taken by the next idle worker."""
        with self._cond:
            if self._closing:
                return HOLD
            if self._queue:  # the oldest job's wait so far: a backlog behind busy workers shows at once
                self._scaler.observe(self._clock() - self._arrival_of(self._queue[0]))
            busy = min(self._busy, self._count)
            step = self._scaler.decide(busy, self._count - busy, len(self._queue))
            if step == SHRINK:
                self._retire += 1
                self._count -= 1
                self.scale_downs += 1
                self._cond.notify_all()
            workers = self._count
        if step == SHRINK:
            logger.info("workers: %d -> %d (low load for %.0fs)", workers + 1, workers, self._scaler.down_after_s)
            self._on_resize(workers)
        return step

    def _grow(self) -> None:
        """Build one more worker's context here, on the control thread, then start the worker."""
        with self._building:
            with self._cond:
                index = next(i for i in count() if i not in self._slots)
            try:
                context = self._make_context(index)
            except Exception:  # a model that cannot load now: keep serving with the workers we have
                logger.exception("workers: could not start worker %d", index)
                return
            if self._halt.is_set():
                return
            self._spawn(index, context)
            self.scale_ups += 1
        logger.info("workers: %d -> %d (queue wait above %.0f ms)", self._count - 1, self._count,
                    self._scaler.up_wait_s * 1000.0)
        self._on_resize(self._count)

    def stop(self, timeout_s: float) -> bool:
        """Stop intake, let queued and running jobs finish within `timeout_s`; True if all did."""
        self._accepting = False
        deadline = time.monotonic() + timeout_s
        self._halt.set()
        if self._control is not None:  # it may be building a worker's context: let it finish first
            self._control.join(max(0.0, deadline - time.monotonic()))
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        for thread in list(self._threads):
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            logger.warning("shutdown: %d job(s) still queued or running after %.1fs (%s)",
                           self.depth + self.busy, timeout_s, ", ".join(alive))
        self._threads = [t for t in self._threads if t.is_alive()]
        return not alive
