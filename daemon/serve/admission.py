"""Admission: which requests are queued, decided in O(1) on paho's thread.

Deadlines decide shedding, not a guess. Neither bound is a message count (a burst of
small requests that fits is served however many it holds):
- memory: the bytes of queued requests stay within `workers.queue_mb`; past it a request
  is answered `overloaded`, unless it is held by the broker (QoS 1), as both links can stop
  reading. Then such a request past the budget is queued anyway (the overshoot is at most the rest of
  one read burst) and `has_room()` turns False, so the link reads nothing more until the
  workers have taken the queue back below `RESUME_SHARE` of the budget: the backlog waits at
  the broker, which holds it at QoS 1, instead of being answered `overloaded`. QoS 0
  requests, which no broker holds, are still answered `overloaded` past the budget;
- latency: a request whose own deadline (an MQTT v5 message expiry) would pass before a
  worker reaches it and serves it alone is answered `expired` at once. A worker then cuts
  each batch so that it is done before the earliest deadline in it (workers.py), and the
  pipeline answers `expired` a request whose deadline its batch would pass: a result is
  never knowingly late. A request without a deadline is queued
  however long the predicted wait while the bytes fit: the broker holds the backlog
  safely at QoS 1, and its client never said it would give up. Only an operator's
  `workers.max_wait_ms` (opt-in, off by default) caps every request's predicted wait,
  answering `overloaded` past it.

The predicted wait is the work queued ahead divided by the workers (those running now,
when the pool is adaptive). Each admitted
request adds its route's measured cost per request to the queued work, and takes it
back when a worker dequeues it. The cost comes from a least-squares fit of batch time
`a * n + b` over recent batches of that route (BentoML's dispatcher fits the same
line), read at a full batch, which is what a deep queue is served in. Until a route
has been measured its cost is 0: only the memory bound holds. Everything here is
arithmetic on a few floats under one lock, so shedding costs the paho thread nothing
it would notice.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

from daemon.errors import EXPIRED, OVERLOADED

# Bytes a queued request holds beyond its payload (the Inbound, the Job, the queue slot).
JOB_OVERHEAD_BYTES = 512
# Reading resumes once the queued bytes are back below this share of the budget (a hold's hysteresis).
RESUME_SHARE = 0.75
# Weight kept by older batches at each new one: about the last 1/(1-0.98) = 50 batches count.
FIT_DECAY = 0.98
# Below this spread of batch sizes the line's slope is unknowable: use time per request.
_MIN_SIZE_VARIANCE = 1e-6
_MS = 1000.0


def _kib(nbytes: int) -> str:
    return f"{nbytes / 1024:,.0f} KiB"


class CostModel:
    """Batch time = a * n + b, fitted over recent (n, seconds) observations, older ones decayed."""

    def __init__(self, decay: float = FIT_DECAY):
        self._decay = decay
        self._w = self._n = self._t = self._nn = self._nt = 0.0
        self.a = 0.0
        self.b = 0.0

    def observe(self, n: int, seconds: float) -> None:
        d = self._decay
        self._w = self._w * d + 1.0
        self._n = self._n * d + n
        self._t = self._t * d + seconds
        self._nn = self._nn * d + n * n
        self._nt = self._nt * d + n * seconds
        self._solve()

    def _solve(self) -> None:
        mean_n, mean_t = self._n / self._w, self._t / self._w
        variance = self._nn / self._w - mean_n * mean_n
        if variance > _MIN_SIZE_VARIANCE:
            slope = (self._nt / self._w - mean_n * mean_t) / variance
            if slope > 0:
                self.a, self.b = slope, max(0.0, mean_t - slope * mean_n)
                return
        self.a, self.b = mean_t / mean_n, 0.0  # all batches one size (or a noisy fit): time per request

    def per_request(self, batch_size: int) -> float:
        """Seconds one request costs when served in batches of `batch_size`."""
        return self.a + self.b / max(1, batch_size)

    def batch(self, n: int) -> float:
        """Seconds a batch of n takes, decode to published replies."""
        return self.a * n + self.b


# Made once per request on paho's thread: slotted, not frozen (see jobs.Job); never assigned after.
@dataclass(slots=True)
class Ticket:
    """What an admitted request holds until a worker dequeues it."""

    nbytes: int
    cost_s: float


@dataclass(slots=True)
class Refusal:
    code: str  # OVERLOADED or EXPIRED
    message: str


class Admission:
    """The queue's memory and latency budget; thread-safe (paho thread admits, workers release)."""

    def __init__(self, budget_bytes: int, max_wait_s: Optional[float], workers: int, batch_size: int,
                 clock: Callable[[], float] = time.monotonic):
        """`max_wait_s`: None (the default config) sheds no request for its predicted wait alone.
        The transport stops reading while `has_room()` is False (module doc)."""
        self._budget = budget_bytes
        self._full = False  # holding: the link reads nothing until the queue is back below RESUME_SHARE
        self.holds = 0  # times the budget filled and reading stopped
        self._max_wait = max_wait_s
        self._workers = max(1, workers)
        self._batch_size = batch_size
        self._clock = clock
        self._lock = threading.Lock()
        self._costs: dict[str, CostModel] = {}
        self.queued_bytes = 0
        self.peak_bytes = 0  # the most ever queued: the budget, plus at most a read burst while holding
        self.queued_work_s = 0.0

    def set_workers(self, workers: int) -> None:
        """The pool grew or shrank: the predicted wait divides by the workers running now."""
        with self._lock:
            self._workers = max(1, workers)

    def predicted_wait_s(self) -> float:
        return self.queued_work_s / self._workers

    def has_room(self) -> bool:
        """False while holding (the budget filled): the link should read nothing more for now."""
        return not self._full

    def admit(self, route: str, payload_bytes: int, deadline: Optional[float] = None,
              held_by_broker: bool = False) -> Ticket | Refusal:
        """A Ticket when the request may queue, else the Refusal to answer it with. `held_by_broker`:
        a QoS > 0 request, which the broker keeps while the link stops reading (module doc)."""
        nbytes = payload_bytes + JOB_OVERHEAD_BYTES
        with self._lock:
            wait = self.predicted_wait_s()
            if self.queued_bytes + nbytes > self._budget and not self._holding(held_by_broker):
                return Refusal(OVERLOADED, f"queued requests hold {_kib(self.queued_bytes)} and this one "
                               f"{_kib(nbytes)}; the budget (workers.queue_mb) is {_kib(self._budget)}")
            if self._max_wait is not None and wait > self._max_wait:
                return Refusal(OVERLOADED, f"predicted wait {wait * _MS:.0f} ms exceeds workers.max_wait_ms "
                               f"{self._max_wait * _MS:.0f}; retry later")
            if deadline is not None and self._clock() + wait + self._batch(route, 1) >= deadline:
                return Refusal(EXPIRED, f"predicted wait {wait * _MS:.0f} ms and its own "
                               f"{self._batch(route, 1) * _MS:.1f} ms pass the request's deadline")
            cost = self._cost(route)
            self.queued_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.queued_bytes)
            self.queued_work_s += cost
        return Ticket(nbytes, cost)

    def _holding(self, held_by_broker: bool) -> bool:
        """Past the budget: True when this request may queue anyway because reading stops (lock held)."""
        if not held_by_broker:
            return False
        if not self._full:
            self._full = True
            self.holds += 1
        return True

    def release(self, ticket: Ticket) -> None:
        """A worker took the request off the queue."""
        with self._lock:
            self.queued_bytes -= ticket.nbytes
            self.queued_work_s = max(0.0, self.queued_work_s - ticket.cost_s)
            if self._full and self.queued_bytes <= self._budget * RESUME_SHARE:
                self._full = False

    def observe(self, route: str, n: int, seconds: float) -> None:
        """A worker served n requests of `route` in `seconds` (decode to published replies)."""
        with self._lock:
            self._costs.setdefault(route, CostModel()).observe(n, seconds)

    def cost_per_request_s(self, route: str) -> float:
        with self._lock:
            return self._cost(route)

    def batch_seconds(self, route: str, n: int) -> float:
        """How long a batch of n of `route` is expected to take (0 until measured): a worker cuts a
        batch so that it ends before the earliest deadline in it (workers.py)."""
        with self._lock:
            return self._batch(route, n)

    def _batch(self, route: str, n: int) -> float:
        model = self._costs.get(route)
        return model.batch(n) if model else 0.0

    def _cost(self, route: str) -> float:
        """A route's measured cost per request at a full batch; 0 until measured (lock held)."""
        model = self._costs.get(route)
        return model.per_request(self._batch_size) if model else 0.0
