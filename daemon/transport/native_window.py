"""The native link's publishes on their way to the broker: a window in flight, the rest queued.

A QoS > 0 publish gets a packet id only when it enters the window, so a long queue never
runs out of the 65,535 ids MQTT has. The window is the smaller of the daemon's own
(ReceiveMaximum, or mqtt.py's REPLY_WINDOW) and the broker's CONNACK ReceiveMaximum: MQTT
v5 forbids more in flight than the broker allows. Not thread-safe: the link holds its lock.
"""

from __future__ import annotations

from collections import deque
from typing import Optional

from daemon.transport.link_common import Out

# MQTT packet identifiers are 1..65535.
MAX_PACKET_ID = 0xFFFF


class PublishWindow:
    """Publishes in flight by packet id (oldest first), and those queued behind the window."""

    def __init__(self, limit: int):
        self.limit = max(1, limit)
        self._inflight: dict[int, Out] = {}
        self._queued: deque[Out] = deque()
        self._last_id = 0

    def offer(self, out: Out) -> Optional[int]:
        """Its packet id if it goes out now; None if it waits behind the window, in order."""
        if self._queued or len(self._inflight) >= self.limit:
            self._queued.append(out)
            return None
        return self._admit(out)

    def acked(self, mid: int) -> tuple[bool, list[tuple[int, Out]]]:
        """The broker has `mid`: (whether it was ours, the queued publishes that go out now)."""
        if self._inflight.pop(mid, None) is None:
            return False, []
        return True, self.fill()

    def fill(self) -> list[tuple[int, Out]]:
        """Queued publishes that fit in the window now, with their new packet ids."""
        admitted = []
        while self._queued and len(self._inflight) < self.limit:
            out = self._queued.popleft()
            admitted.append((self._admit(out), out))
        return admitted

    def in_flight(self) -> list[tuple[int, Out]]:
        """What was sent and not acknowledged, oldest first: resent after a reconnect."""
        return list(self._inflight.items())

    def new_id(self) -> int:
        """A packet id no publish in flight holds (also for SUBSCRIBE and UNSUBSCRIBE)."""
        for _ in range(MAX_PACKET_ID):
            self._last_id = self._last_id % MAX_PACKET_ID + 1
            if self._last_id not in self._inflight:
                return self._last_id
        raise RuntimeError("all 65,535 MQTT packet ids are in flight")

    def take_all(self) -> list[Out]:
        """Everything not confirmed, in flight first, then queued (in order); the window is empty after."""
        left = list(self._inflight.values()) + list(self._queued)
        self._inflight.clear()
        self._queued.clear()
        return left

    def owned(self, keys: set[int]) -> list[Out]:
        """The publishes, in flight or queued, whose owner's id() is in `keys`."""
        return [out for out in (*self._inflight.values(), *self._queued) if id(out.owner) in keys]

    def reown(self, owners: dict[int, object]) -> list[tuple[Optional[int], object]]:
        """Hand each publish whose owner's id() is a key of `owners` to its new owner (it goes out,
        or is resent, as before); returns (its packet id, None while queued; its old owner) for each."""
        moved: list[tuple[Optional[int], object]] = []
        for mid, out in self._inflight.items():
            new = owners.get(id(out.owner))
            if new is not None:
                self._inflight[mid] = out._replace(owner=new)
                moved.append((mid, out.owner))
        queued: deque[Out] = deque()
        for out in self._queued:
            new = owners.get(id(out.owner))
            if new is not None:
                moved.append((None, out.owner))
                out = out._replace(owner=new)
            queued.append(out)
        self._queued = queued
        return moved

    @property
    def unacked(self) -> int:
        """Publishes sent and not acknowledged yet."""
        return len(self._inflight)

    @property
    def pending(self) -> int:
        return len(self._inflight) + len(self._queued)

    def _admit(self, out: Out) -> int:
        mid = self.new_id()
        self._inflight[mid] = out
        return mid
