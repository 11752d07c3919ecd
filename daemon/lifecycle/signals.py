"""Signals, gunicorn's way: a handler only queues the signal; the main loop acts on it.

`SignalQueue.install()` runs first thing in `edge-inferd run`, before the config and
the models load, so a SIGHUP or SIGTERM that arrives while the daemon starts is queued,
not fatal (SIGHUP's default action would end the process). The handlers neither log
nor raise, with one exception: a second SIGINT raises `ForcedExit` at once, since the
main thread may be blocked in a drain that nothing else would interrupt.
"""

from __future__ import annotations

import signal
import threading
from collections import deque
from typing import Optional


class ForcedExit(BaseException):
    """A second SIGINT: stop now, without draining.

    A BaseException, like KeyboardInterrupt: it usually arrives while `shutdown()` waits
    for a step, and must pass its `except Exception` that keeps the other steps stopping."""


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class SignalQueue:
    """Received signals, in order, and an Event that wakes the main loop."""

    def __init__(self) -> None:
        self._pending: deque[int] = deque()
        self.wake = threading.Event()
        self.interrupts = 0

    @classmethod
    def install(cls) -> "SignalQueue":
        queue = cls()
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, queue.handle)
        return queue

    def handle(self, signum: int, frame: object = None) -> None:
        if signum == signal.SIGINT:
            self.interrupts += 1
            if self.interrupts > 1:
                raise ForcedExit("second SIGINT: exiting without draining")
        self._pending.append(signum)
        self.wake.set()

    def pop(self) -> Optional[int]:
        """The oldest queued signal, or None."""
        try:
            return self._pending.popleft()
        except IndexError:
            self.wake.clear()
            return None

    def wait(self, timeout_s: float) -> bool:
        """True when a signal is queued (at once, or within timeout_s)."""
        return bool(self._pending) or self.wake.wait(timeout_s)

    @property
    def stop_requested(self) -> bool:
        return any(signum in STOP_SIGNALS for signum in list(self._pending))
