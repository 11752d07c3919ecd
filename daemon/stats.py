"""Counters, a latency reservoir, and rate-limited logging of per-request problems.

The stats topic and the Prometheus exporter come later and read `Stats.snapshot()`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from typing import Callable

import numpy as np

# Recent latencies kept for percentiles: enough for a stable p99, bounded memory.
_LATENCY_WINDOW = 4096
# A given kind of per-request problem is logged at most once per this many seconds.
DEFAULT_LOG_INTERVAL_S = 10.0


class Stats:
    """Thread-safe named counters plus recent end-to-end latencies."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._latency_ms: deque[float] = deque(maxlen=_LATENCY_WINDOW)

    def incr(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    def observe_latency(self, ms: float) -> None:
        with self._lock:
            self._latency_ms.append(ms)

    def count(self, name: str) -> int:
        with self._lock:
            return self._counts[name]

    def snapshot(self) -> dict:
        with self._lock:
            counts = dict(self._counts)
            lat = np.array(self._latency_ms, dtype=np.float64)
        out: dict = {"counts": counts}
        if lat.size:
            out["latency_ms"] = {"p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99)),
                                 "n": int(lat.size)}
        return out


class ThrottledLog:
    """Logs a warning per key at most once per interval, with how many were suppressed."""

    def __init__(self, logger: logging.Logger, interval_s: float = DEFAULT_LOG_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic):
        self._logger = logger
        self._interval = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._suppressed: Counter[str] = Counter()

    def warning(self, key: str, msg: str, *args: object, exc_info: bool = False) -> None:
        now = self._clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self._interval:
                self._suppressed[key] += 1
                return
            self._last[key] = now
            suppressed = self._suppressed.pop(key, 0)
        if suppressed:
            msg += " (%d similar suppressed)"
            args += (suppressed,)
        self._logger.warning(msg, *args, exc_info=exc_info)
