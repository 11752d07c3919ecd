"""`workers.processes` > 1: one node, P worker processes, gunicorn's arbiter in small.

Each child is a whole daemon (`edge-inferd run` with the same arguments, told its index by
the environment: daemon/lifecycle/heartbeat.py) with its own MQTT connection: client id
`<client_id>-w<i>`, a persistent session, and every route in the share group
`mqtt.share_group` (or, unset, the node's client id), so the broker splits the node's
requests between them. A child restarted under its id resumes its session: the requests
it held unacked are redelivered to it (docs/scaling.md).

The parent loads no model. It holds the node's own MQTT connection: `online` on
`edge-inferd/<client_id>/status` once every child serves, the LWT `offline`, and the
node's stats, summed from the children's heartbeats. Its rules (`Rules`, clock-injected):
- a child is judged by progress: its heartbeat file is rewritten only while its MQTT loop
  and workers move; one older than `stale_s` (or never written within `boot_s`) is
  SIGKILLed, and restarted like a crash;
- a child that exits is restarted after a backoff (1 s doubling to 30 s; back to 1 s once
  a child ran a minute), while the others keep serving;
- a child that exits 78 (a bad model or config) stops the node with 78: no restart loop;
- SIGTERM or SIGINT: SIGTERM to every child, each drains; SIGHUP is forwarded (each
  reloads on its own);
- systemd: READY=1 once every child serves; the watchdog is fed only while every child beats.
Children never see $NOTIFY_SOCKET.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional, Sequence

from daemon.pipeline import codecs
from daemon.lifecycle import heartbeat
from daemon.config.schema import Config
from daemon.config.mqtt import OutboxConfig
from daemon.transport.mqtt import MqttLink
from daemon.obs.node_sums import fold, summed
from daemon.lifecycle.notify import Notifier
from daemon.lifecycle.signals import SignalQueue
from daemon.errors import EXIT_CONFIG  # a child that cannot start for its config or model: the node cannot either

logger = logging.getLogger(__name__)

# How often the parent looks at its children when no signal wakes it.
TICK_S = 0.25
# Grace beyond workers.drain_timeout_s for a child to close its session before SIGKILL.
DRAIN_GRACE_S = 10.0


@dataclass(frozen=True)
class Rules:
    """The supervisor's decisions, with the clock passed in (unit tests use a fake one)."""

    backoff_min_s: float = 1.0
    backoff_max_s: float = 30.0
    healthy_after_s: float = 60.0  # a child that ran this long restarts after backoff_min_s again
    stale_s: float = 30.0  # heartbeat age past which a serving child counts as stuck
    boot_s: float = 120.0  # time to the first heartbeat (model loading, warm-up)

    def restart_delay(self, failures: int) -> float:
        """Delay before restart number `failures` (1, 2, ...) in a row."""
        return min(self.backoff_max_s, self.backoff_min_s * 2 ** max(0, failures - 1))

    def failures_after(self, failures: int, ran_s: float) -> int:
        """The crash streak after a child that ran `ran_s` exited."""
        return 1 if ran_s >= self.healthy_after_s else failures + 1

    def stuck(self, now: float, started_at: float, beat_at: Optional[float]) -> bool:
        """No heartbeat for `stale_s` (or none at all within `boot_s` of the start)."""
        if beat_at is None or beat_at < started_at:
            return now - started_at > self.boot_s
        return now - beat_at > self.stale_s


class Child:
    """One worker process slot: the process (None while waiting to restart) and its record."""

    def __init__(self, index: int, run_dir: Path):
        self.index = index
        self.heartbeat = run_dir / f"w{index}.json"
        self.proc: Optional[subprocess.Popen] = None
        self.started_at = 0.0
        self.restart_at = 0.0
        self.failures = 0
        self.restarts = 0
        self.last: dict = {}  # the latest heartbeat content
        self.past: dict = {}  # earlier incarnations' counters (node_sums.fold), for the node's sums

    def beat_at(self) -> Optional[float]:
        try:
            return self.heartbeat.stat().st_mtime
        except OSError:
            return None


def child_config(config: Config, index: int) -> Config:
    """A worker process's config: its own client id, status and outbox, in the node's share group."""
    mqtt = config.mqtt
    outbox = replace(mqtt.outbox, dir=mqtt.outbox.dir / f"w{index}")
    return replace(config, mqtt=replace(mqtt, client_id=f"{mqtt.client_id}-w{index}", outbox=outbox,
                                        share_group=mqtt.share_group or mqtt.client_id),
                   workers=replace(config.workers, processes=1),
                   metrics=replace(config.metrics, port=None))  # one port cannot serve P processes


def child_env(index: int, beat: Path, environ: Optional[dict] = None) -> dict:
    env = {k: v for k, v in (os.environ if environ is None else environ).items()
           if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}  # systemd talks to the parent only
    env[heartbeat.INDEX_ENV] = str(index)
    env[heartbeat.HEARTBEAT_ENV] = str(beat)
    return env


class Supervisor:
    def __init__(self, config: Config, argv: Sequence[str], signals: SignalQueue, rules: Rules = Rules(),
                 clock: Callable[[], float] = time.time, notifier: Optional[Notifier] = None):
        """`argv`: the command that starts one child (`edge-inferd run` with the parent's arguments)."""
        self.config = config
        self._argv = list(argv)
        self._signals = signals
        self._rules = rules
        self._clock = clock
        self._notifier = notifier or Notifier()
        self._run_dir = Path(tempfile.mkdtemp(prefix="edge-inferd-workers-"))
        self._children = [Child(i, self._run_dir) for i in range(config.workers.processes)]
        self._link: Optional[MqttLink] = None
        self._started_at = clock()
        self._online = False
        self._exit: Optional[int] = None

    def run(self) -> int:
        """Start the children, supervise until stopped, drain; the node's exit code."""
        try:
            _prepare_cache(self.config)
            self._connect()
            for child in self._children:
                self._spawn(child)
            self._main_loop()
        finally:
            self._drain()
            self._disconnect()
            shutil.rmtree(self._run_dir, ignore_errors=True)
        return self._exit or 0

    def _main_loop(self) -> None:
        last_stats = self._clock()
        while self._exit is None:
            if self._signals.wait(TICK_S) and self._handle_signals():
                return
            for child in self._children:
                self._look_after(child)
            serving = all(c.proc is not None and c.last.get("ready") for c in self._children)
            if serving and not self._online:
                self._online = True
                self._link.open_intake()  # `online` on the node's status topic
                self._notifier.ready(f"serving with {len(self._children)} worker processes")
                logger.info("all %d worker processes serve", len(self._children))
            self._notifier.watchdog(serving and not any(self._stuck(c) for c in self._children))
            if self._clock() - last_stats >= self.config.stats_interval_s:
                last_stats = self._clock()
                self._publish_stats()
        self._notifier.stopping()

    def _handle_signals(self) -> bool:
        """True when asked to stop (TERM or INT); HUP goes on to every child."""
        while (signum := self._signals.pop()) is not None:
            if signum == signal.SIGHUP:
                logger.info("SIGHUP: forwarded to the worker processes")
                self._send_all(signal.SIGHUP)
                continue
            logger.info("%s: draining the worker processes", signal.Signals(signum).name)
            return True
        return False

    def _look_after(self, child: Child) -> None:
        now = self._clock()
        if child.proc is None:
            if now >= child.restart_at:
                self._spawn(child)
            return
        child.last = heartbeat.read(child.heartbeat) or child.last
        code = child.proc.poll()
        if code is None:
            if self._stuck(child):
                logger.error("worker w%d (pid %d) made no progress for %.0fs: killing it", child.index,
                             child.proc.pid, now - (child.beat_at() or child.started_at))
                child.proc.kill()
            return
        self._exited(child, code, now)

    def _stuck(self, child: Child) -> bool:
        return child.proc is not None and self._rules.stuck(self._clock(), child.started_at, child.beat_at())

    def _exited(self, child: Child, code: int, now: float) -> None:
        child.proc = None
        if code == EXIT_CONFIG:
            logger.error("worker w%d exited with %d (config or model): stopping the node", child.index, code)
            self._exit = EXIT_CONFIG
            return
        child.failures = self._rules.failures_after(child.failures, now - child.started_at)
        delay = self._rules.restart_delay(child.failures)
        child.restart_at = now + delay
        logger.error("worker w%d exited with %s; restarting it in %.0fs (the others keep serving)", child.index,
                     code if code >= 0 else signal.Signals(-code).name, delay)

    def _spawn(self, child: Child) -> None:
        try:
            child.heartbeat.unlink()
        except FileNotFoundError:
            pass
        if child.last.get("stats"):
            child.past = fold(child.past, child.last["stats"])
        child.last = {}
        child.started_at = self._clock()
        if child.restart_at:
            child.restarts += 1
        child.proc = subprocess.Popen(self._argv, env=child_env(child.index, child.heartbeat))
        logger.info("worker w%d started (pid %d)", child.index, child.proc.pid)

    def _send_all(self, signum: int) -> None:
        for child in self._children:
            if child.proc is not None and child.proc.poll() is None:
                child.proc.send_signal(signum)

    def _drain(self) -> None:
        """SIGTERM to every child, then wait for each (SIGKILL past the drain time and a grace)."""
        self._send_all(signal.SIGTERM)
        deadline = time.monotonic() + self.config.workers.drain_timeout_s + DRAIN_GRACE_S
        for child in self._children:
            if child.proc is None:
                continue
            try:
                code = child.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.error("worker w%d did not drain in time: killing it", child.index)
                child.proc.kill()
                code = child.proc.wait()
            child.last = heartbeat.read(child.heartbeat) or child.last
            logger.info("worker w%d stopped (exit %d)", child.index, code)
            child.proc = None

    def _connect(self) -> None:
        """The node's own connection: no subscriptions, a clean session, no outbox; LWT `offline`."""
        mqtt = replace(self.config.mqtt, session_expiry_s=0, share_group=None, outbox=OutboxConfig(max_mb=0))
        self._link = MqttLink(mqtt, (), lambda burst: None)
        self._link.start()

    def _disconnect(self) -> None:
        if self._link is None:
            return
        snapshot = self._publish_stats()
        self._link.stop()
        logger.info("node stopped; summed stats %s", codecs.encode(snapshot).decode())

    def _publish_stats(self) -> dict:
        snapshot = summed({f"{self.config.mqtt.client_id}-w{c.index}": {
            "stats": c.last.get("stats"), "past": c.past, "restarts": c.restarts, "ready": c.last.get("ready")}
            for c in self._children}, self._clock() - self._started_at)
        if self._link is not None and self._link.connected.is_set():
            self._link.publish(self.config.mqtt.stats_topic, codecs.encode(snapshot), retain=True)
        return snapshot


def _prepare_cache(config: Config) -> None:
    """Open the disk cache once before any child does: a corrupt one is quarantined here, once,
    not by P children racing to rename the directory under each other."""
    if config.cache.enabled:
        from daemon.cache.disk_tier import open_disk

        disk = open_disk(config.cache.dir, config.cache.max_mb)
        if disk is not None:
            disk.close()
