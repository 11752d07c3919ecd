"""Where `bench e2e` runs its consumers: `--consumer-cpus` and `--consumer-cpu-share`.

On a small machine the broker, the C publisher and the reply collector share the cores with
the consumer they load, and at 2x a consumer's capacity they saturate first (docs/performance.md,
"Overload, read honestly"). `--consumer-cpus 1` puts every consumer (echo, naive, the daemon and
its threads) on CPU 1 and the bench itself, with the broker and the clients it starts, on the
others. `--consumer-cpu-share 0.35` also caps the consumers at that share of one CPU (a cgroup
`cpu.max`, as systemd's CPUQuota= does), a slower gateway, so that 2x its capacity is a load the
broker's cores carry. Linux only; the cap needs root (it writes under /sys/fs/cgroup).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Optional

from daemon.errors import DaemonError

CGROUP_ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 10_000  # a short period: the cap throttles in 10 ms steps, not 100 ms ones


def parse_cpus(text: str) -> tuple[int, ...]:
    """"1" or "2,3" or "2-3" -> the CPU numbers."""
    cpus: list[int] = []
    try:
        for part in text.split(","):
            low, dash, high = part.partition("-")
            cpus.extend(range(int(low), int(high if dash else low) + 1))
    except ValueError:
        raise DaemonError(f"--consumer-cpus: {text!r} is not a CPU list (1, 2,3 or 2-3)") from None
    return tuple(sorted(set(cpus)))


class Placement:
    """Pins the bench to the CPUs the consumers do not get, and each consumer (`preexec`) to theirs."""

    def __init__(self, consumer_cpus: tuple[int, ...] = (), share: Optional[float] = None):
        self.consumer_cpus = consumer_cpus
        self.share = share
        self._cgroup: Optional[Path] = None
        self._own: Optional[set[int]] = None  # the bench's CPUs before, given back on exit
        if share is not None and not 0 < share <= len(consumer_cpus or os.sched_getaffinity(0)):
            raise DaemonError(f"--consumer-cpu-share: {share} is not a share of the consumers' CPUs")

    def __enter__(self) -> "Placement":
        if self.consumer_cpus:
            available = os.sched_getaffinity(0)
            others = available - set(self.consumer_cpus)
            if not set(self.consumer_cpus) <= available or not others:
                raise DaemonError(f"--consumer-cpus {self.consumer_cpus}: of this machine's CPUs "
                                  f"{sorted(available)}, some must be given and some left for the broker")
            self._own = available
            os.sched_setaffinity(0, others)
        if self.share is not None:
            self._cgroup = _make_cgroup(self.share)
        return self

    def __exit__(self, *exc) -> None:
        if self._own is not None:
            os.sched_setaffinity(0, self._own)
        if self._cgroup is not None:
            _remove(self._cgroup)

    @property
    def preexec(self) -> Optional[Callable[[], None]]:
        """Run in each consumer's child before it execs: its CPUs and its cgroup."""
        if not self.consumer_cpus and self._cgroup is None:
            return None
        cpus, procs = self.consumer_cpus, (self._cgroup / "cgroup.procs" if self._cgroup else None)

        def enter() -> None:
            if cpus:
                os.sched_setaffinity(0, cpus)
            if procs is not None:
                procs.write_text(str(os.getpid()))
        return enter

    def meta(self) -> dict:
        return {"consumer_cpus": list(self.consumer_cpus), "consumer_cpu_share": self.share}


def _make_cgroup(share: float) -> Path:
    """A cgroup capped at `share` of one CPU: v2's cpu.max, else v1's cfs quota."""
    unified = CGROUP_ROOT / "cgroup.controllers"
    quota = str(round(share * PERIOD_US))
    if unified.exists() and "cpu" in unified.read_text().split():  # v2 (not the v1 machine measured on)
        path, files = CGROUP_ROOT / f"edge-inferd-bench-{os.getpid()}", {"cpu.max": f"{quota} {PERIOD_US}"}
        _enable_cpu_controller()
    else:
        path = CGROUP_ROOT / "cpu" / f"edge-inferd-bench-{os.getpid()}"
        files = {"cpu.cfs_period_us": str(PERIOD_US), "cpu.cfs_quota_us": quota}
    try:
        path.mkdir()
        for name, value in files.items():
            (path / name).write_text(value)
    except OSError as exc:
        raise DaemonError(f"--consumer-cpu-share: cannot make the cgroup {path} ({exc.strerror}); it needs "
                          "root and a cgroup cpu controller") from None
    return path


def _enable_cpu_controller() -> None:
    """v2: the root's children get the cpu controller only once it is in its subtree_control."""
    try:
        (CGROUP_ROOT / "cgroup.subtree_control").write_text("+cpu")
    except OSError:
        pass  # already there, or refused: mkdir and cpu.max then say so


def _remove(path: Path) -> None:
    try:
        path.rmdir()  # a cgroup is removed with rmdir, once its processes have ended
    except OSError:
        pass
