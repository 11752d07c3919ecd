"""Escalated requests waiting for a far tier, holding no worker (`to_topic` and `to_v2`).

Each request is parked under a fresh key with its local answer and a deadline. Whoever takes it
out first answers it, under the lock, so a request is answered exactly once: the far tier's
answer (`answer`), or the expiry thread (`"escalation": "timeout"`: the local answer), or
`stop` (the same). A far answer that finds nothing parked (late, or from an earlier run) is
dropped and counted in `late`.

Every reply that leaves a parking, far answer or local fallback, says `latency_ms` from the
request's arrival to now (`since_arrival`): a fallback waited for the far tier too, and the
local answer's own figure (made when the local inference ended) would hide that wait from the
user and from the stats' latency, which is fed by the replies' `latency_ms` (replies.py).
"""

from __future__ import annotations

import heapq
import itertools
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

from daemon.transport.inbound import Inbound

TIMEOUT = "timeout"
KEY_PREFIX_BYTES = 4
STOP_JOIN_S = 5.0
MS = 1000.0


@dataclass
class Parked:
    inbound: Inbound
    reply_topic: str
    local: dict
    deadline: float


Send = Callable[[Inbound, str, dict], None]  # replies.Replier.send_one: publish, then ack on PUBACK


class Parking:
    """The parked requests, their deadlines and the thread that answers the expired ones locally."""

    def __init__(self, send: Send, clock: Callable[[], float] = time.monotonic, name: str = "escalations"):
        self._send = send
        self._clock = clock
        self._name = name
        self._pending: dict[bytes, Parked] = {}
        self._heap: list[tuple[float, bytes]] = []
        self._cond = threading.Condition()
        self._prefix = os.urandom(KEY_PREFIX_BYTES).hex()  # keys of an earlier run never match
        self._ids = itertools.count()
        self._stopping = False
        self._thread: Optional[threading.Thread] = None
        self.late = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._expire_loop, name=self._name, daemon=True)
        self._thread.start()

    def park(self, inbound: Inbound, reply_topic: str, local: dict, timeout_s: float) -> bytes:
        """Hold a request's local answer until the far tier answers or `timeout_s` has passed since
        the request arrived (its queueing and local inference count: the user waits for those too)."""
        key = f"{self._prefix}-{next(self._ids)}".encode()
        deadline = inbound.received_at + timeout_s
        with self._cond:
            self._pending[key] = Parked(inbound, reply_topic, local, deadline)
            heapq.heappush(self._heap, (deadline, key))
            self._cond.notify()
        return key

    def since_arrival(self, inbound: Inbound) -> float:
        """Milliseconds from the request's arrival to now: a parked request's `latency_ms`."""
        return round((self._clock() - inbound.received_at) * MS, 3)

    def fallback(self, parked: Parked, escalation: str) -> dict:
        """The local answer, marked with why the far tier did not answer, timed to now."""
        return {**parked.local, "escalation": escalation, "latency_ms": self.since_arrival(parked.inbound)}

    def deadline(self, key: bytes) -> Optional[float]:
        """The parked request's deadline; None once it has been answered."""
        with self._cond:
            parked = self._pending.get(key)
            return None if parked is None else parked.deadline

    def answer(self, key: bytes, reply_of: Callable[[Parked], dict]) -> bool:
        """Answer a parked request with `reply_of(parked)` (True), or count a late answer (False)."""
        with self._cond:
            parked = self._pending.pop(key, None)
            if parked is None:
                self.late += 1
                return False
        self._send(parked.inbound, parked.reply_topic, reply_of(parked))
        return True

    def expire_due(self) -> None:
        """Answer locally every request past its deadline (the expiry thread; tests call it too)."""
        due = []
        with self._cond:
            now = self._clock()
            while self._heap and (self._heap[0][0] <= now or self._heap[0][1] not in self._pending):
                _, key = heapq.heappop(self._heap)
                parked = self._pending.pop(key, None)
                if parked is not None:
                    due.append(parked)
        for parked in due:
            self._send(parked.inbound, parked.reply_topic, self.fallback(parked, TIMEOUT))

    def _expire_loop(self) -> None:
        while True:
            self.expire_due()
            with self._cond:
                if self._stopping:
                    return
                wait = self._heap[0][0] - self._clock() if self._heap else None
                if wait is None or wait > 0:
                    self._cond.wait(wait)  # woken by `park` (an earlier deadline) or `stop`

    def stop(self) -> None:
        """Answer every parked request locally (`timeout`) and end the expiry thread."""
        with self._cond:
            self._stopping = True
            left, self._pending, self._heap = list(self._pending.values()), {}, []
            self._cond.notify()
        for parked in left:
            self._send(parked.inbound, parked.reply_topic, self.fallback(parked, TIMEOUT))
        if self._thread is not None:
            self._thread.join(STOP_JOIN_S)

    @property
    def pending(self) -> int:
        return len(self._pending)
