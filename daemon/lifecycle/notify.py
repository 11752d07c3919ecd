"""sd_notify for `Type=notify`: READY=1, STATUS=, and a watchdog fed only by progress.

The protocol is one datagram per message to the AF_UNIX socket named by $NOTIFY_SOCKET
(an '@' prefix is the abstract namespace). Outside systemd the variable is unset and
every call is a no-op. `WATCHDOG=1` is sent every `WATCHDOG_USEC / 2`, but only while
`progressing()` says the MQTT loop and the workers are alive and moving: a wedged worker
or a dead paho thread stops the pings, and systemd restarts the service.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Callable, Optional

logger = logging.getLogger(__name__)

_US = 1_000_000.0
# Pings per watchdog period (systemd's advice: at least every half period).
_PINGS_PER_PERIOD = 2


class Notifier:
    """Messages to systemd; silent when not run by systemd."""

    def __init__(self, environ: Optional[dict] = None, clock: Callable[[], float] = time.monotonic):
        env = os.environ if environ is None else environ
        self._address = env.get("NOTIFY_SOCKET") or None
        if self._address and self._address.startswith("@"):
            self._address = "\0" + self._address[1:]
        usec = env.get("WATCHDOG_USEC", "")
        self.watchdog_interval_s = int(usec) / _US / _PINGS_PER_PERIOD if usec.isdigit() and int(usec) else None
        self._clock = clock
        self._last_ping = float("-inf")
        self._ready = False

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def ready(self, status: str) -> None:
        if not self._ready:
            self._ready = True
            self._send(f"READY=1\nSTATUS={status}")

    def status(self, status: str) -> None:
        self._send(f"STATUS={status}")

    def stopping(self) -> None:
        self._send("STOPPING=1")

    def watchdog(self, progressing: bool) -> None:
        """Ping when due and the daemon makes progress; a stalled daemon is left to the watchdog."""
        if self.watchdog_interval_s is None or self._clock() - self._last_ping < self.watchdog_interval_s:
            return
        if not progressing:
            logger.warning("not feeding the systemd watchdog: the MQTT loop or a worker makes no progress")
            return
        self._last_ping = self._clock()
        self._send("WATCHDOG=1")

    def _send(self, message: str) -> None:
        if self._address is None:
            return
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.connect(self._address)
                sock.sendall(message.encode())
        except OSError as exc:
            logger.warning("sd_notify to %r failed: %s", self._address, exc)
