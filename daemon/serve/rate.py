"""Per-device rate control: `min_interval_ms` at admission, `coalesce: latest` at the worker.

A device is a request topic (`sensors/dev7/imu`). For each device of a route that uses
either key, `DeviceRate` keeps when its last request was admitted and the sequence number
of its newest queued job, in one LRU bounded by `MAX_DEVICES`: a device pushed out only
loses its state (its next request is admitted, its queued jobs are all served), so the
bound never drops a request. Every call is O(1) under one lock: `too_soon` and `admitted`
run on paho's network thread, `superseded` on the workers.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # config imports this module for its choices: keep it off the stats floor
    from daemon.obs.stats import Stats

# Devices whose rate state is kept (as many as intake's route memo remembers topics).
MAX_DEVICES = 4096
COALESCE_LATEST = "latest"
COALESCE_CHOICES = (COALESCE_LATEST,)
# Stats counters: devices tracked now (a gauge kept with +1/-1) and devices pushed out of the LRU.
DEVICES = "rate_devices"
EVICTED = "rate_devices_evicted"
_MS = 1000.0


class _Device:
    __slots__ = ("admitted_at", "newest")

    def __init__(self) -> None:
        self.admitted_at: Optional[float] = None  # when its last request was admitted
        self.newest: Optional[int] = None  # sequence number of its newest coalescing job


class DeviceRate:
    """What `min_interval_ms` and `coalesce` remember per device, bounded."""

    def __init__(self, stats: "Stats", max_devices: int = MAX_DEVICES):
        self._stats = stats
        self._max = max_devices
        self._lock = threading.Lock()
        self._devices: OrderedDict[str, _Device] = OrderedDict()
        self._seq = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._devices)

    def too_soon(self, device: str, min_interval_ms: float, now: float) -> bool:
        """True when `device`'s last admitted request is less than `min_interval_ms` old."""
        if min_interval_ms <= 0:
            return False
        with self._lock:
            state = self._devices.get(device)
            return state is not None and state.admitted_at is not None and \
                (now - state.admitted_at) * _MS < min_interval_ms

    def admitted(self, device: str, now: float, coalesce: bool) -> int:
        """Record an admitted request; returns its job's sequence number (0 when not coalescing)."""
        with self._lock:
            state = self._touch(device)
            state.admitted_at = now
            if not coalesce:
                return 0
            self._seq += 1
            state.newest = self._seq
            return self._seq

    def withdraw(self, device: str, seq: int) -> None:
        """A job that was never queued (the pool is stopping): it supersedes nothing."""
        with self._lock:
            state = self._devices.get(device)
            if state is not None and state.newest == seq:
                state.newest = None

    def superseded(self, device: str, seq: int) -> bool:
        """True when a newer job of `device` was admitted after job `seq` (a worker's check)."""
        if not seq:
            return False
        with self._lock:
            state = self._devices.get(device)
            # Unknown (pushed out of the LRU): serve it rather than guess.
            return state is not None and state.newest is not None and state.newest != seq

    def _touch(self, device: str) -> _Device:
        """The device's state, most recently used; a new one may push out the oldest (lock held)."""
        state = self._devices.get(device)
        if state is not None:
            self._devices.move_to_end(device)
            return state
        state = self._devices[device] = _Device()
        self._stats.incr(DEVICES)
        if len(self._devices) > self._max:
            self._devices.popitem(last=False)
            self._stats.incr(DEVICES, -1)
            self._stats.incr(EVICTED)
        return state
