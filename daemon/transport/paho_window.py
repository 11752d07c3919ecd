"""The broker's ReceiveMaximum kept on the paho link: replies past it wait here, in order.

MQTT 5 (4.9.0) allows a client no more unacknowledged QoS > 0 publishes than the broker's
ReceiveMaximum, from its CONNACK (mosquitto's `max_inflight_messages`: 20 by default). paho 2.x
reads the property and does not keep to it, and refuses to change its own window on a live
connection (`max_inflight_messages_set` raises RuntimeError once connected). So the link keeps to
it itself: a reply (or a flushed outbox row) is handed to paho only while fewer than the limit
wait for their PUBACK; the rest wait here, oldest first, and each PUBACK hands on the next. The
few publishes that are not replies (status, stats, escalations) are not counted: the retained
`offline` must go out at stop whatever waits. MQTT 3.1.1 has no ReceiveMaximum: the limit is the
daemon's own window. paho itself is given no window (mqtt.py says why).
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Callable, Generic, Optional, TypeVar

Item = TypeVar("Item")


class Window(Generic[Item]):
    """Counts the replies in flight against a limit; `send` is called (outside the lock) for each
    one let through once room opens."""

    def __init__(self, send: Callable[[Item], object]):
        self._send = send
        self._lock = threading.Lock()
        self._limit: Optional[int] = None  # none until a CONNACK says
        self._in_flight = 0
        self._waiting: deque[Item] = deque()

    def connected(self, limit: int) -> None:
        """A CONNACK's limit. What is in flight stays counted: paho resends it on this connection."""
        with self._lock:
            self._limit = max(1, limit)
        self._release()

    def offer(self, item: Item) -> bool:
        """True: the caller sends it now (counted in flight); False: it waits its turn here."""
        with self._lock:
            if self._waiting or not self._has_room():
                self._waiting.append(item)
                return False
            self._in_flight += 1
            return True

    def confirmed(self) -> None:
        """A counted publish's PUBACK is in: its place goes to the next waiting one."""
        with self._lock:
            self._in_flight = max(0, self._in_flight - 1)
        self._release()

    def take_waiting(self) -> list[Item]:
        """Everything still waiting, oldest first, no longer here (at stop: for the outbox)."""
        with self._lock:
            items = list(self._waiting)
            self._waiting.clear()
            return items

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def _has_room(self) -> bool:
        return self._limit is None or self._in_flight < self._limit

    def _release(self) -> None:
        while True:
            with self._lock:
                if not self._waiting or not self._has_room():
                    return
                item = self._waiting.popleft()
                self._in_flight += 1
            self._send(item)
