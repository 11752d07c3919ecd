"""The stress phases of `bench e2e` (a burst of 30,000, overload, open loop at 1,000/s, the cache
pair): the config as written (`DEFAULT`), the plan's route.

- burst30k: `--burst` requests (30,000) through one `mosquitto_pub -l`, no deadlines; the
  results (not replies) and the errors by code.
- overload: the drain capacity, then an open loop at OVERLOAD_MULTIPLE x it for
  OVERLOAD_FACTOR x `--duration` (10 s by default), (a) without deadlines: results/s while
  sending and after, lost; (b) with a v5 Message Expiry of EXPIRY_S on every request
  (`mosquitto_pub -V 5 -D publish message-expiry-interval 1`): results, how late the latest
  came back (p99 and max of reply time minus send time), `expired`. Each half on a fresh
  daemon, so (b) does not start behind (a)'s backlog.
- openloop1000: OPENLOOP_RATE requests/s for `--duration`, daemon then echo: p99s and errors.
- cachepair: one drain each of the daemon with the cache on (as configured) and off: the
  CPU per request difference on a stream that never repeats.

Every request is distinct (workload.py). Each consumer keeps the config's persistent
session, which is ended once it stops (load.end_session), so no round inherits a backlog.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Iterator

import numpy as np

from daemon.errors import DaemonError
from daemon.obs.stats_topic import stopped_stats
from daemon.tools.bench.load import ConsumerProcess, expiry_args, percentiles
from daemon.tools.bench.phases import Bench, Consumer, PacedRun
from daemon.tools.bench.plan import EXTRA_PHASES
from daemon.tools.bench.workload import Workload

logger = logging.getLogger(__name__)

DEFAULT = Consumer("daemon", "daemon", session=True)
NO_CACHE = Consumer("daemon-nocache", "daemon", {"cache": {"enabled": False}}, session=True)
ECHO = Consumer("echo", "echo")
STRESS_CONSUMERS = (DEFAULT, NO_CACHE, ECHO)
OVERLOAD_MULTIPLE = 2.0
OVERLOAD_FACTOR = 2.0  # x --duration: 10 s by default
EXPIRY_S = 1
OPENLOOP_RATE = 1000.0
RESULT_KINDS = ("result", "hit")


class Stress:
    def __init__(self, bench: Bench, workload: Workload):
        self.bench = bench
        self.plan = bench.plan
        self.workload = workload
        self.topic = workload.request_topic

    def run(self) -> None:
        for phase in (p for p in EXTRA_PHASES if p in self.plan.phases):
            try:
                self.bench.results[phase] = getattr(self, f"_{phase}")()
            except DaemonError as exc:  # record it and go on with the other phases
                logger.warning("%s: %s", phase, exc)
                self.bench.results.setdefault("errors", {})[phase] = str(exc)

    @contextmanager
    def _running(self, consumer: Consumer) -> Iterator[ConsumerProcess]:
        proc = self.bench.start(consumer)
        try:
            yield proc
        finally:
            proc.stop()

    def _drain(self, proc: ConsumerProcess, n: int) -> dict:
        return self.bench.drain(proc, self.workload.line, self.topic, n)

    def _burst30k(self) -> dict:
        logger.info("burst30k: %s, %d requests", DEFAULT.name, self.plan.burst)
        with self._running(DEFAULT) as proc:
            return self._drain(proc, self.plan.burst)

    def _overload(self) -> dict:
        duration = OVERLOAD_FACTOR * self.plan.duration
        with self._running(DEFAULT) as proc:
            capacity = self._drain(proc, self.plan.requests)
            rate = OVERLOAD_MULTIPLE * capacity["rps"]
            logger.info("overload: %.0f req/s (%.0fx capacity) for %.1fs, no deadlines", rate, OVERLOAD_MULTIPLE,
                        duration)
            point, run = self.bench.paced(proc, self.topic, rate, duration, self.workload.line)
        no_deadline = {**self._rates(point, run, capacity["rps"]), **self._where(proc, capacity, len(run.ids))}
        logger.info("overload: the same with a %d s message expiry, on a fresh daemon", EXPIRY_S)
        with self._running(DEFAULT) as proc:
            point, run = self.bench.paced(proc, self.topic, rate, duration, self.workload.line, expiry_args(EXPIRY_S))
        return {"capacity": capacity, "multiple": OVERLOAD_MULTIPLE, "no_deadline": no_deadline,
                f"expiry_{EXPIRY_S}s": self._lateness(point, run, capacity["rps"])}

    def _where(self, proc: ConsumerProcess, capacity: dict, sent: int) -> dict:
        """Where a loss happened: what the publisher sent (warm-ups and the drain included) beside
        what the daemon says it received (its stats at stop), its link's nudges and held-window acks."""
        stats = stopped_stats(proc.log.read_text(errors="replace")) or {}
        outbox = stats.get("outbox") or {}
        return {"published": 2 * self.plan.warmup + capacity["sent"] + sent,
                "daemon_received": stats.get("received"), "daemon_nudges": outbox.get("nudges"),
                "daemon_acks_after_outbox": outbox.get("acks_after_outbox")}

    def _result_times(self, run: PacedRun) -> list[tuple[float, float]]:
        """(sent, came back) of each request of `run` answered with a result."""
        by_id = self.bench.collector.by_id
        return [(run.sent_at[i], r.at) for i in run.ids if (r := by_id.get(i)) is not None and r.kind in RESULT_KINDS]

    def _rates(self, point: dict, run: PacedRun, capacity_rps: float) -> dict:
        """Results/s while the load was sent and after it stopped, against the drain capacity."""
        end = run.start + run.sent_s
        back = [at for _, at in self._result_times(run)]
        during = sum(1 for at in back if at <= end)
        after_s = max(back, default=end) - end
        overall = len(back) / max(max(back, default=end) - run.start, 1e-9)
        return {**point, "capacity_rps": capacity_rps,
                "results_per_s_during": round(during / max(run.sent_s, 1e-9), 1),
                "results_per_s_after": round((len(back) - during) / after_s, 1) if after_s > 0 else 0.0,
                "results_per_s": round(overall, 1), "of_capacity": round(overall / max(capacity_rps, 1e-9), 3)}

    def _lateness(self, point: dict, run: PacedRun, capacity_rps: float) -> dict:
        """How late the results came back (reply minus send), and how many against capacity x time."""
        late_ms = [(at - sent) * 1000.0 for sent, at in self._result_times(run)]
        worst = round(max(late_ms), 1) if late_ms else None
        return {**point, "capacity_rps": capacity_rps, "lateness_ms": {**percentiles(late_ms), "max": worst},
                "results_of_capacity_x_time": round(point["results"] / max(capacity_rps * run.sent_s, 1e-9), 3)}

    def _openloop1000(self) -> dict:
        rows = {}
        for consumer in (DEFAULT, ECHO):
            logger.info("openloop1000: %s at %.0f req/s for %.1fs", consumer.name, OPENLOOP_RATE, self.plan.duration)
            with self._running(consumer) as proc:
                rows[consumer.name] = self.bench.paced(proc, self.topic, OPENLOOP_RATE, self.plan.duration,
                                                       self.workload.line)[0]
        p99 = [rows[c.name]["result_rtt_ms"]["p99"] for c in (DEFAULT, ECHO)]
        rows["p99_ratio"] = round(p99[0] / p99[1], 2) if all(p99) else None
        return rows

    def _cachepair(self) -> dict:
        rows = {}
        for consumer in (DEFAULT, NO_CACHE):
            logger.info("cachepair: %s, %d distinct requests", consumer.name, self.plan.requests)
            with self._running(consumer) as proc:
                rows[consumer.name] = self._drain(proc, self.plan.requests)
        cpu = [rows[c.name]["cpu_us_per_request"] for c in (DEFAULT, NO_CACHE)]
        rows["cpu_us_diff"] = round(float(np.subtract(*cpu)), 1)
        return rows
