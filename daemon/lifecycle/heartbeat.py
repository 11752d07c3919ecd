"""A worker process's heartbeat: the supervisor's view of a child (daemon/lifecycle/supervisor.py).

A child of `workers.processes` > 1 runs the ordinary `Service` with this object in place
of the systemd `Notifier`: the main loop calls it exactly as it would the notifier, so the
heartbeat is fed by the same progress check as systemd's watchdog. `watchdog(True)` (the
MQTT loop and the workers move) rewrites the file, atomically, with the child's stats;
`watchdog(False)` leaves it alone, so its mtime ages and the supervisor kills the child
once it is older than its limit, as gunicorn judges workers by `WorkerTmp.notify()`.
`ready()` (subscribed and `online` on the child's own status topic) sets `ready` in it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Callable, Optional

logger = logging.getLogger(__name__)

# Environment of a worker process: its index, and the file it beats into.
INDEX_ENV = "EDGE_INFERD_WORKER_INDEX"
HEARTBEAT_ENV = "EDGE_INFERD_HEARTBEAT"
# The child's main loop checks progress every half of this; it beats at most this often.
HEARTBEAT_INTERVAL_S = 2.0


def read(path: Path) -> Optional[dict]:
    """A heartbeat file's content ({"ready", "pid", "stats"}), or None when there is none yet."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class Heartbeat:
    """The Notifier interface (ready, status, stopping, watchdog), written to a file."""

    watchdog_interval_s = HEARTBEAT_INTERVAL_S

    def __init__(self, path: Path, snapshot: Callable[[], dict], clock: Callable[[], float] = time.monotonic):
        self._path = path
        self._tmp = path.with_name(path.name + ".tmp")
        self._snapshot = snapshot
        self._clock = clock
        self._ready = False
        self._last_beat = -math.inf

    def ready(self, status: str) -> None:
        if not self._ready:
            self._ready = True
            self._beat()

    def status(self, status: str) -> None:
        """Status lines are systemd's; the parent reads the stats instead."""

    def stopping(self) -> None:
        """The parent knows: it sent the SIGTERM."""

    def watchdog(self, progressing: bool) -> None:
        """Beat when due, as systemd's watchdog is pinged: the main loop ticks faster near an idle
        unload or before it is online, and each beat is a stats snapshot written to disk."""
        if progressing and self._clock() - self._last_beat >= self.watchdog_interval_s:
            self._beat()

    def final(self) -> None:
        """After the drain: the stats at stop, for the node's sums (the file is no longer judged)."""
        self._beat()

    def _beat(self) -> None:
        self._last_beat = self._clock()
        try:
            self._tmp.write_text(json.dumps({"ready": self._ready, "pid": os.getpid(), "stats": self._snapshot()}))
            os.replace(self._tmp, self._path)  # the parent never reads half a file
        except OSError as exc:
            logger.warning("heartbeat %s: %s", self._path, exc)
