"""A private mosquitto on a free loopback port, for the demo and the integration tests.

Persistence is on with `autosave_interval 1` in a directory we own: with mosquitto's
default of 1800 s a SIGKILL loses queued messages (PITFALLS.md). Started as root,
mosquitto would drop to the `mosquitto` user and silently run without persistence if
that user cannot write the directory, so `user` is set to the current user.
`set_tcp_nodelay true`: mosquitto's default leaves Nagle on, which adds ~40 ms
delayed-ACK stalls to small messages (see docs/performance.md).
`max_queued_messages`: mosquitto's default of 1,000 per client silently drops QoS 1
messages past it. A 5,000-request `mosquitto_pub -l` burst reached even a C subscriber
(`mosquitto_sub`) only 1,025 times with the default, and 5,000 times with a larger
limit: no consumer can read as fast as the C publisher writes, so bursts need room in
the broker (docs/performance.md, "Broker settings").
"""

from __future__ import annotations

import getpass
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence

from daemon.errors import DaemonError

LOOPBACK = "127.0.0.1"  # every private broker listens here (tests/integration/rumqttd.py and ejabberd.py too)
_READY_TIMEOUT_S = 10.0
_POLL_S = 0.02
_STOP_TIMEOUT_S = 5.0
_CANDIDATES = ("mosquitto", "/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto")
# Messages mosquitto may queue per client before dropping (its default, 1,000, loses bursts).
MAX_QUEUED_MESSAGES = 100_000
# What mosquitto logs (to the broker's log file): errors and warnings only, unless asked for more.
LOG_TYPES = ("error", "warning")


def find_mosquitto() -> str:
    for candidate in _CANDIDATES:
        found = shutil.which(candidate)
        if found:
            return found
    raise DaemonError("mosquitto is not installed: apt-get install mosquitto (./scripts/test.sh does this)")


def end_process(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout_s: float = _STOP_TIMEOUT_S) -> int:
    """Send `sig` and wait up to `timeout_s`; kill it if it is still there. Returns the exit code."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


class BrokerProcess:
    """A broker as a child process on a free loopback port; subclasses write its config.

    `with b: ... b.address`; `stop()` (SIGTERM) / `kill()` (SIGKILL) / `start()` may be repeated.
    A subclass supplies `_command()`, and may supply `_env()` and `_ready()` (a check of its own
    before the port counts: ejabberd's log line), and its timeouts.
    """

    name = "broker"
    log_name = "broker.log"  # the child's stdout and stderr, in workdir
    ready_timeout_s = _READY_TIMEOUT_S
    stop_timeout_s = _STOP_TIMEOUT_S

    def __init__(self, workdir: Optional[Path] = None, port: Optional[int] = None, settings=None):
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix=f"edge-inferd-{self.name}-")
        self.workdir = Path(workdir or self._tmp.name)
        self.port = port or free_port()
        self._proc: Optional[subprocess.Popen] = None
        self._settings = dict(settings or {})

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> Optional[int]:
        """The running broker's process id (a benchmark reads its CPU from /proc), None when stopped."""
        return self._proc.pid if self._proc is not None else None

    @property
    def log_path(self) -> Path:
        """The file an error names: the broker's own log."""
        return self.workdir / self.log_name

    def _command(self) -> list[str]:
        """Write the config under `workdir` and return the command line that runs the broker."""
        raise NotImplementedError

    def _env(self) -> Optional[dict[str, str]]:
        return None  # the daemon's environment

    def _ready(self) -> bool:
        """Besides its port accepting: the broker says it is ready (default: nothing more to ask)."""
        return True

    def start(self):
        command = self._command()
        log = open(self.workdir / self.log_name, "ab")
        self._proc = subprocess.Popen(command, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                      cwd=self.workdir, env=self._env())
        log.close()
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise DaemonError(f"{self.name} exited with {self._proc.returncode}; see {self.log_path}")
            if self._ready():
                try:
                    with socket.create_connection((LOOPBACK, self.port), timeout=_POLL_S * 10):
                        return
                except OSError:
                    pass
            time.sleep(_POLL_S)
        self.kill()
        raise DaemonError(f"{self.name} did not listen on port {self.port} within {self.ready_timeout_s:.0f}s; "
                          f"see {self.log_path}")

    def stop(self) -> None:
        self._end(signal.SIGTERM)

    def kill(self) -> None:
        self._end(signal.SIGKILL)

    def _end(self, sig: int) -> None:
        if self._proc is not None:
            end_process(self._proc, sig, self.stop_timeout_s)
            self._proc = None

    def close(self) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class Broker(BrokerProcess):
    """`with Broker() as b: ... b.address`; `stop()` / `kill()` / `start()` may be repeated."""

    name = "mosquitto"
    log_name = "mosquitto.log"

    def __init__(self, workdir: Optional[Path] = None, port: Optional[int] = None,
                 settings: Optional[dict[str, str]] = None, log_types: Sequence[str] = ()):
        """`settings` add to or replace mosquitto.conf lines (e.g. TLS files, `allow_anonymous`).
        `log_types`: what mosquitto logs beyond LOG_TYPES (e.g. "notice": each connect and
        disconnect; "information": each autosave), one `log_type` line each."""
        super().__init__(workdir, port, settings)
        self._log_types = (*LOG_TYPES, *log_types)

    def _command(self) -> list[str]:
        return [find_mosquitto(), "-c", str(self._write_config())]

    def _write_config(self) -> Path:
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        conf = self.workdir / "mosquitto.conf"
        settings = {
            "allow_anonymous": "true",
            "persistence": "true",
            "persistence_location": f"{data}/",
            "autosave_interval": "1",
            "set_tcp_nodelay": "true",
            "max_queued_messages": str(MAX_QUEUED_MESSAGES),
            "user": getpass.getuser(),
            "log_dest": "stderr",
            **self._settings,
        }
        lines = [f"listener {self.port} {LOOPBACK}"] + [f"{key} {value}" for key, value in settings.items()]
        conf.write_text("\n".join(lines + [f"log_type {kind}" for kind in self._log_types] + [""]))
        return conf
