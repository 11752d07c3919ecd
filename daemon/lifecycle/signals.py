"""Signals, gunicorn's way: a handler only queues the signal; the main loop acts on it.

`SignalQueue.install()` runs first thing in `edge-inferd run`, before the config and
the models load, so a SIGHUP or SIGTERM that arrives while the daemon starts is queued,
not fatal (SIGHUP's default action would end the process). The handlers neither log
nor raise, with one exception: a second SIGINT raises `ForcedExit` at once, since the
main thread may be blocked in a drain that nothing else would interrupt.

The handler wakes the main loop by writing a byte to a non-blocking pipe, never through a
`threading.Event`: Python runs a handler in the main thread between two bytecodes, and an
`Event.set()` there takes the Event's own lock, which that same thread may be holding at that
moment (inside `wait()` or `clear()`); a lock that is not reentrant then deadlocks, and the
daemon ignores SIGTERM for good (seen once in a full suite run: no log line after SIGTERM,
killed after 60 s).
"""

from __future__ import annotations

import os
import select
import signal
from collections import deque
from typing import Callable, Optional


class ForcedExit(BaseException):
    """A second SIGINT: stop now, without draining.

    A BaseException, like KeyboardInterrupt: it usually arrives while `shutdown()` waits
    for a step, and must pass its `except Exception` that keeps the other steps stopping."""


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class SignalQueue:
    """Received signals, in order, and a pipe that wakes the main loop (module doc: no lock)."""

    def __init__(self) -> None:
        self._pending: deque[int] = deque()  # append and popleft are atomic: no lock needed
        self._calls: deque = deque()  # work another thread hands the main loop (post)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
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
        self._wake()

    def post(self, call: Callable[[], None]) -> None:
        """From another thread: run `call` on the main loop, which this wakes (the fleet agent's swaps)."""
        self._calls.append(call)
        self._wake()

    def pop_call(self) -> Optional[Callable[[], None]]:
        try:
            return self._calls.popleft()
        except IndexError:
            return None

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"s")
        except BlockingIOError:
            pass  # the pipe is full of wake-ups already: the loop will look

    def pop(self) -> Optional[int]:
        """The oldest queued signal, or None."""
        try:
            return self._pending.popleft()
        except IndexError:
            return None

    def wait(self, timeout_s: float) -> bool:
        """True when a signal or a call is queued (at once, or within timeout_s)."""
        if self._pending or self._calls:
            return True
        ready, _, _ = select.select([self._wake_r], [], [], max(0.0, timeout_s))
        if ready:
            try:
                os.read(self._wake_r, 4096)  # drain: the deque is what counts
            except BlockingIOError:
                pass
        return bool(self._pending or self._calls)

    @property
    def stop_requested(self) -> bool:
        return any(signum in STOP_SIGNALS for signum in list(self._pending))
