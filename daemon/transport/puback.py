"""What waits for the broker to have a publish (its PUBACK), by message id.

A request is acknowledged only once its reply is safe at the broker, and an outbox row is
deleted only then (daemon/transport/mqtt.py's module doc says why acking on `publish()` lost
requests). MqttLink registers every QoS > 0 publish here with its owner and feeds paho's
`on_publish` in; the owner is handed back once its PUBACK is in.
"""

from __future__ import annotations

import threading
from typing import Callable, Optional


class AwaitingPuback:
    """What waits for the broker to have a publish (its PUBACK), by mid: a request's ack, an
    outbox row's removal, or nothing (status and stats).

    paho runs `on_publish` before it marks the message published, and may run it before
    `publish()` has returned the mid to us; such early completions wait in `_early` for
    the publish that produced them. Every publish registers (status ones with no owner),
    so an early mid is always claimed and none go stale."""

    def __init__(self, done: Callable[[object], None]):
        self._done = done
        self._lock = threading.Lock()
        self._awaiting: dict[int, Optional[object]] = {}
        self._early: set[int] = set()

    def register(self, mid: int, owner: Optional[object]) -> None:
        with self._lock:
            if mid in self._early:
                self._early.discard(mid)
            else:
                self._awaiting[mid] = owner
                return
        if owner is not None:
            self._done(owner)

    def completed(self, mid: int) -> None:
        with self._lock:
            if mid not in self._awaiting:
                self._early.add(mid)
                return
            owner = self._awaiting.pop(mid)
        if owner is not None:
            self._done(owner)

    def reown(self, mid: int, owner: object) -> None:
        """`mid`'s PUBACK now completes `owner` instead (the native link's safe_ack.py)."""
        with self._lock:
            if mid in self._awaiting:
                self._awaiting[mid] = owner

    def owner(self, mid: int) -> Optional[object]:
        with self._lock:
            return self._awaiting.get(mid)

    @property
    def pending(self) -> int:
        return len(self._awaiting)
