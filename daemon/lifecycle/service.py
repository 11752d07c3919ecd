"""Builds the daemon from a Config and runs it: ordered start-up, reversed shutdown.

Start-up is one list of steps (steps.py): models -> cache -> serving -> mqtt -> workers ->
metrics -> intake. MQTT connects before the workers start because a resumed persistent
session delivers its held requests right at connect: intake queues them until the workers run.
Shutdown runs the started steps in reverse: intake closes first, then the workers
drain queued and in-flight work while MQTT still carries their replies and acks, and
only then is `offline` published and the connection closed. A step that fails at
start-up stops the ones before it and re-raises; only `cli.py` turns that into an exit
code.

Signals (signals.py) are queued by their handlers and handled here, in the main
loop: SIGTERM and the first SIGINT drain and stop; a second SIGINT raises `ForcedExit`
from its handler; SIGHUP reloads (reload.py): a hot swap of changed models, or
an ordered restart of the steps from the first one a change affects.
"""

from __future__ import annotations

import logging
import signal
import time
from typing import Callable, Optional

from daemon.cache.result_cache import ResultCache
from daemon.config.fleet import node_topics
from daemon.config.loader import load_config
from daemon.config.schema import Config
from daemon.lifecycle import drift_reference
from daemon.lifecycle.gc_settle import settle_gc
from daemon.lifecycle.reload_apply import Reloads
from daemon.lifecycle.link import open_link
from daemon.lifecycle.models import load_models, worker_models
from daemon.lifecycle.notify import Notifier
from daemon.lifecycle.signals import SignalQueue
from daemon.lifecycle.steps import Step, StepName
from daemon.model.residency import ModelInfo, Residency
from daemon.obs import stats_topic
from daemon.obs.drift import DriftMonitor
from daemon.obs.model_watch import ModelWatch
from daemon.obs.stats import Stats
from daemon.pipeline import codecs
from daemon.pipeline.route_pipeline import route_pipelines
from daemon.serve import wiring
from daemon.serve.ha_devices import DiscoveredDevices
from daemon.serve.jobs import WorkerModels
from daemon.transport.mqtt import MqttLink

logger = logging.getLogger(__name__)

# How often the main loop logs a one-line stats summary.
STATS_LOG_INTERVAL_S = 60.0
# Until READY=1, the main loop looks for the broker's SUBACK this often.
READY_POLL_S = 0.2
# The watchdog is checked this many times per ping interval.
WATCHDOG_CHECKS_PER_PING = 2
# A worker with work that has not moved for this many ping intervals (or STALL_LIMIT_S
# without a watchdog) is wedged: the pings stop and systemd restarts the daemon.
STALL_LIMIT_PINGS = 1
STALL_LIMIT_S = 30.0
# The main loop looks for idle models at least this far apart (a copy busy past its idle time).
IDLE_CHECK_MIN_S = 0.05
# A model's version over HTTP: its sha256 prefix, as replies' `model_sha256`.
MODEL_VERSION_CHARS = 12


class Service(Reloads):
    def __init__(self, config: Config, signals: Optional[SignalQueue] = None,
                 reread: Optional[Callable[[], Config]] = None, notifier: Optional[Notifier] = None):
        """`reread` reads the config again for a reload (default: its source file, models unchecked).
        `notifier`: a worker process's heartbeat (daemon/lifecycle/heartbeat.py) in place of systemd's."""
        self.config = config
        self._reread = reread or (lambda: load_config(config.source, check_models=False))
        self._metrics_served = False
        self._pins: dict[str, str] = {}  # model name -> sha256 a reload checked
        self.stats = Stats()
        self.drift = DriftMonitor(config.drift)  # kept across reloads: a route unchanged keeps its window
        self.signals = signals or SignalQueue()
        self._stopping = False
        self._models: dict[str, ModelInfo] = {}  # the reference copies' digests; their interpreters are freed
        self._residency = Residency(lambda: self.config.workers.idle_unload_s)
        self._cache: Optional[ResultCache] = None
        self._serving: Optional[wiring.Serving] = None
        self._link: Optional[MqttLink] = None
        self.watch = ModelWatch() if config.fleet.enabled else None  # each release's answers, for the canary
        self._http = None  # the HTTP listener (daemon/lifecycle/http.py), while the HTTP step runs
        self._agent = None  # the fleet agent (daemon/fleet/node/agent.py), while the FLEET step runs
        self._devices: Optional[DiscoveredDevices] = None  # Home Assistant discovery; kept across reloads
        self._rate = stats_topic.RequestRate()
        self._started: list[Step] = []
        self._started_at = time.monotonic()
        self._notifier = notifier or Notifier()

    def steps(self) -> list[Step]:
        return [
            Step(StepName.MODELS, self._load_models),
            Step(StepName.CACHE, self._open_cache, self._close_cache),
            Step(StepName.SERVING, self._build_serving),
            Step(StepName.MQTT, self._connect, self._disconnect),
            Step(StepName.WORKERS, self._start_workers, self._stop_workers),
            Step(StepName.METRICS, self._serve_metrics),
            Step(StepName.INTAKE, lambda: self._link.open_intake(), lambda: self._link.close_intake()),
            Step(StepName.FLEET, self._start_fleet, self._stop_fleet),
            Step(StepName.HTTP, self._start_http, self._stop_http),
        ]

    def run(self) -> None:
        """Start, serve until asked to stop, then shut down. Raises on a failed start-up."""
        try:
            self.startup()
            if self.signals.stop_requested:
                logger.info("stop requested during start-up")
                return
            workers = self.config.workers
            logger.info("serving %d route(s) with %s worker(s)", len(self.config.routes),
                        workers.max if workers.min >= workers.max else f"{workers.min}-{workers.max}")
            self._main_loop()
        finally:
            self.shutdown()

    def _main_loop(self) -> None:
        """Until asked to stop: READY=1 once online, the watchdog, the retained stats, a log line a minute."""
        last_stats = last_log = time.monotonic()
        self._publish_stats()
        ready = False  # READY=1 goes once (the notifier ignores a second): no status line per tick after it
        while True:
            if not ready and self._link.online.is_set():
                ready = True
                self._notifier.ready(self._status_line())
            self._notifier.watchdog(self._progressing())
            now = time.monotonic()
            if now - last_stats >= self.config.stats_interval_s:
                last_stats = now
                snapshot = self._publish_stats()
                self._notifier.status(self._status_line())
                if now - last_log >= STATS_LOG_INTERVAL_S:
                    last_log = now
                    logger.info("%s", stats_topic.summary_line(snapshot))
                    logger.debug("stats %s", codecs.encode(snapshot).decode())
            self._residency.unload_idle()
            if self._devices is not None:  # announce the node once online, remove idle devices
                self._devices.tick(now, self._link.online.is_set())
            if self.signals.wait(self._tick()):
                self._handle_signals()
            if self._stopping:
                break
        self._notifier.stopping()

    def _tick(self) -> float:
        tick = self.config.stats_interval_s
        if self._notifier.watchdog_interval_s:
            tick = min(tick, self._notifier.watchdog_interval_s / WATCHDOG_CHECKS_PER_PING)
        due = self._residency.due_in()
        if due is not None:  # wake when the next model may go idle (not before: a copy in use is skipped)
            tick = min(tick, max(due, IDLE_CHECK_MIN_S))
        return tick if self._link.online.is_set() else min(tick, READY_POLL_S)

    def _progressing(self) -> bool:
        limit = (self._notifier.watchdog_interval_s or STALL_LIMIT_S) * STALL_LIMIT_PINGS
        return self._link.loop_alive and self._serving.pool.progressing(limit)

    def _status_line(self) -> str:
        return (f"serving {len(self.config.routes)} route(s): {self.stats.count('received')} received, "
                f"{self.stats.count('results')} results")

    def _publish_stats(self) -> dict:
        snapshot = self.snapshot()
        snapshot["requests_per_s"] = self._rate.update(snapshot["received"], time.monotonic())
        if self._link is not None and self._link.connected.is_set():  # not piled up in paho while away
            self._link.publish(self.config.mqtt.stats_topic, codecs.encode(snapshot), retain=True)
        return snapshot

    def startup(self) -> None:
        if self.config.fleet.enabled:  # imported only when on: the fleet brings cryptography and urllib
            from daemon.lifecycle import fleet_node

            if fleet_node.boot(self.config):  # a swap a kill interrupted, finished; a crashing canary undone
                self.config = self._reread()
        self._start_steps(0, {}, "start-up")
        settle_gc()

    def shutdown(self) -> None:
        self._stop_down_to(0)
        snapshot = self.snapshot()
        logger.info("%s", stats_topic.summary_line(snapshot))
        # The full object last: stats_topic.stopped_stats reads it back (the tests, `edge-inferd bench soak`).
        logger.info("%s%s", stats_topic.STOPPED_PREFIX, codecs.encode(snapshot).decode())

    def _stop_down_to(self, index: int) -> None:
        """Stop the started steps after the first `index`, last started first."""
        while len(self._started) > index:
            self._stop_step(self._started.pop())

    @staticmethod
    def _stop_step(step: Step) -> None:
        if step.stop is None:
            return
        logger.info("shutdown: %s", step.name)
        try:
            step.stop()
        except Exception:  # keep stopping the rest
            logger.exception("shutdown step %s failed", step.name)

    def snapshot(self) -> dict:
        """The node's stats (daemon/obs/stats_topic.py): counters, cache hit rate, queue, models, latency."""
        link, pool = self._link, self._serving.pool if self._serving else None
        stats = stats_topic.payload(self.stats.snapshot(), time.monotonic() - self._started_at,
                                  {name: m.sha256 for name, m in self._models.items()},
                                  pool.size if pool else self.config.workers.max,
                                  self._queue_state(), self._cache, link.reconnects if link else 0,
                                  link.outbox_state() if link else {}, pool.scaling() if pool else None,
                                  self._residency.state())
        reuse = self._serving.reuse_snapshot() if self._serving else {}
        if reuse:  # routes with the per-device fast path (daemon/pipeline/reuse.py): devices, hits, misses, skipped
            stats["reuse"] = reuse
        streams = self._serving.streams_snapshot() if self._serving else {}
        if streams:  # stream routes (daemon/serve/streams.py): streams held, and their windows' bytes
            stats["streams"] = streams
        drift = self.drift.snapshot()  # the PSIs are computed here, not per answer (daemon/obs/drift.py)
        if drift:
            stats["drift"] = stats_topic.rounded(drift)
        http = self.stats.http_counts()
        if http:  # the HTTP listener's requests by route ("" for none named) and status
            stats["http"] = http
        if self._serving is not None and self._serving.far_v2 is not None:  # the to_v2 far tiers' breakers
            stats["to_v2"] = self._serving.far_v2.snapshot()
        if self._devices is not None and self._devices.enabled:  # Home Assistant discovery's bounded count
            stats["homeassistant"] = self._devices.snapshot()
        return stats

    def _queue_state(self) -> Optional[dict]:
        return self._serving.queue_state() if self._serving is not None else None

    def _serve_metrics(self) -> None:
        if self.config.metrics.port is not None and not self._metrics_served:  # once: a reload cannot rebind
            self._metrics_served = True
            from daemon.obs import prometheus  # optional: only a configured endpoint needs prometheus-client

            prometheus.serve(self.config.metrics.port, self.config.metrics.address, self.stats,
                             lambda: self._queue_state() or {}, self._residency.state, self._cache_state,
                             self.drift.snapshot)

    def _cache_state(self) -> dict:
        cache = self._cache
        return cache.snapshot() if cache is not None and cache.enabled else {}

    def _handle_signals(self) -> None:
        """The main loop's side of the signal queue: TERM and INT stop, HUP reloads."""
        while (call := self.signals.pop_call()) is not None:  # the fleet agent's swaps
            call()
        while (signum := self.signals.pop()) is not None:
            if signum == signal.SIGHUP:
                self._reload()
                continue
            name = "SIGINT (again to force)" if signum == signal.SIGINT else signal.Signals(signum).name
            logger.info("%s: draining and stopping (up to %.0fs)", name, self.config.workers.drain_timeout_s)
            self._stopping = True

    def _start_steps(self, index: int, digests: dict, label: str = "reload") -> None:
        """Start the steps from `index` on, the models pinned to `digests` (a reload's check)."""
        self._pins = dict(digests)
        for step in self.steps()[index:]:
            logger.info("%s: %s", label, step.name)
            step.start()
            self._started.append(step)

    def _load_models(self, names: Optional[frozenset] = None) -> None:
        """Verify and load each model (or those named) once; its digest pins the workers' copies.
        On a reload, the digests read before the child's check pin the files (`_pins`)."""
        self._models = load_models(self.config, self._pins, names, self._models if names is not None else None)

    def _worker_models(self, index: int) -> WorkerModels:
        return worker_models(self.config, self._models, self._residency)

    def _open_cache(self) -> None:
        self._cache = ResultCache(self.config.cache)

    def _close_cache(self) -> None:
        if self._cache is not None:
            self._cache.close()

    def _build_serving(self) -> None:
        if self._devices is None:
            self._devices = DiscoveredDevices(self.config)
        else:  # a reload: entities of routes gone or changed are removed
            self._devices.reconfigure(self.config)
        cache = self._cache if self._cache is not None and self._cache.enabled else None
        pipes = route_pipelines(self.config, self._models)
        drift_reference.configure(self.drift, self.config, pipes, self._models)  # references of changed routes
        self._serving = wiring.build(pipes, cache, self.stats,
                                     self.config.workers, self._worker_models, self.config.batching,
                                     escalation_topic=self.config.mqtt.escalation_topic,
                                     drift=self.drift,
                                     devices=self._devices if self._devices.enabled else None,
                                     watch=self.watch,
                                     control=self._fleet_message if self.config.fleet.enabled else None)

    def _start_workers(self) -> None:
        self._serving.start()

    def _stop_workers(self) -> None:
        self._serving.stop(self.config.workers.drain_timeout_s)

    def _connect(self) -> None:
        filters = self._serving.filters + node_topics(self.config.fleet, self.config.mqtt)
        self._link = open_link(self.config, self._serving, filters)
        self._devices.attach(self._link.publish)
        self._link.start()

    def _disconnect(self) -> None:
        self._link.stop()

    def _start_http(self) -> None:
        if self.config.http.enabled:  # imported only when on
            from daemon.lifecycle import http

            self._http = http.open_listener(self.config, self._serving, self._link, self.stats,
                                            lambda model: self._models[model].sha256[:MODEL_VERSION_CHARS])

    def _stop_http(self) -> None:
        if self._http is not None:
            from daemon.lifecycle import http

            http.stop_listener(self._http, self.config)
            self._http = None

    @property
    def http_port(self) -> Optional[int]:
        """The HTTP listener's bound port (http.port 0 binds a free one), or None while it is off."""
        return self._http.port if self._http is not None else None

    def _start_fleet(self) -> None:
        if self.config.fleet.enabled:
            from daemon.lifecycle import fleet_node

            self._agent = fleet_node.make_agent(fleet_node.ServiceHost(self, self.signals.post))
            self._agent.start()

    def _stop_fleet(self) -> None:
        if self._agent is not None:
            self._agent.stop()
            self._agent = None

    def _fleet_message(self, topic: str, payload: bytes) -> bool:
        """Intake, on the MQTT thread: a fleet document or command goes to the agent (True)."""
        agent = self._agent
        return agent is not None and agent.on_message(topic, payload)

    @property
    def link(self) -> Optional[MqttLink]:
        return self._link

    @property
    def models(self) -> dict[str, ModelInfo]:
        return self._models

    def uptime_s(self) -> float:
        return time.monotonic() - self._started_at
