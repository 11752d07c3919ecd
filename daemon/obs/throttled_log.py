"""Rate-limited logging of per-request problems: one line per kind and interval, with a count of the rest."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Callable

# A given kind of per-request problem is logged at most once per this many seconds.
DEFAULT_LOG_INTERVAL_S = 10.0


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
