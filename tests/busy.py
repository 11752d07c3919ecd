"""A busy machine for tests that judge timing: a busy loop per core, each a process of its own,
switched on (SIGCONT) and off (SIGSTOP), as other processes on a shared box come and go."""

from __future__ import annotations

import os
import signal
import subprocess
import sys


# Each loop asks Linux for SIGKILL when its parent dies (prctl PR_SET_PDEATHSIG), stopped or not:
# a test killed outright leaves no loop behind.
_LOOP = ("import ctypes, signal\ntry:\n    ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))\nexcept (OSError, AttributeError):\n"
         "    pass\nwhile True:\n    pass\n")


class BusyLoops:
    def __init__(self, busy: bool = False, count: int = 0):
        """`count`: loops (0: one per core)."""
        self.procs = [subprocess.Popen([sys.executable, "-c", _LOOP]) for _ in range(count or os.cpu_count() or 2)]
        self.set(busy)

    def set(self, busy: bool) -> None:
        for proc in self.procs:
            proc.send_signal(signal.SIGCONT if busy else signal.SIGSTOP)

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait(10)

    def __enter__(self) -> "BusyLoops":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
