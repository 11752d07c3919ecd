"""The phases of `bench e2e`: drain, open loop, cache-hit path, batching on the heavier model.

Each consumer process is started once and runs every phase that concerns it, so the
consumers see the same requests in the same order: the plan's route's, from `workload`
(distinct, from its validate data or its input spec). The stress phases are in stress.py.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import yaml

from daemon import topics
from daemon.tools.bench.load import (Collector, ConsumerProcess, LinePublisher, Outcome, drain_summary, end_session,
                                     json_line, last_reply, outcome)
from daemon.config.loader import load_config
from daemon.tools.bench.plan import Plan, parse_rate
from daemon.config.reader import absolute_paths
from daemon.errors import DaemonError
from daemon.tools.bench.workload import Workload


logger = logging.getLogger(__name__)

# REQUEST_TOPIC, NOISE_STD and activity_lines: the activity route's, for benchmarks/step_load.py and
# daemon/tools/bench/soak.py; bench e2e itself takes its topics and requests from workload.py.
REQUEST_TOPIC = "sensors/bench/imu"
RAW_TOPIC = "plugs/bench/power/raw"
RAW_ROUTE_MODEL = "appliance"
RAW_WARMUP = 50
# Share of the mixed cache stream that repeats earlier data exactly (with a new id).
REPEAT_SHARE = 0.2
CACHE_RATE_MULTIPLE = 0.5  # the mixed cache stream is paced at this multiple of capacity...
CACHE_RATE_MAX = 1000.0  # ...but no faster than this (req/s)
# Noise (sensor units) that makes each activity sample a distinct cache key. The key is the
# INT8 model input, so it must move values by more than one input quantization step
# (~0.1 here after normalization); smaller noise is exactly what the cache absorbs.
NOISE_STD = 0.5
SEED = 7
_RAWPUB_TIMEOUT_S = 120.0
_WARMUP_TIMEOUT_S = 60.0
# Points at or above this multiple of capacity run this many times --duration.
LONG_RATE_MULTIPLE, LONG_DURATION_FACTOR = 2.0, 2.0
REPLY_FILTER = "results/bench/#"


@dataclass(frozen=True)
class Consumer:
    name: str
    kind: str  # echo | naive | daemon
    overrides: dict = field(default_factory=dict)
    # True: the config's own session (the default config's is persistent), ended once it stops.
    session: bool = False
    args: tuple[str, ...] = ()  # echo, naive: more `python -m daemon.tools.baselines` arguments


def write_bench_config(base: Path, workdir: Path, client_id: str, overrides: dict, session: bool = False) -> Path:
    """A copy of `base` with absolute model paths, a private cache dir, and `overrides` per section.
    Unless `session`, a clean session: a stopped consumer's persistent session would stay subscribed
    to the shared request topic and make the broker queue every later request for it too."""
    raw = absolute_paths(yaml.safe_load(base.read_text()), base.parent)
    raw["cache"] = {**(raw.get("cache") or {}), "dir": str(workdir / "cache")}
    raw["mqtt"] = {**(raw.get("mqtt") or {}), "client_id": client_id}
    if not session:
        raw["mqtt"]["session_expiry_s"] = 0
    for section, values in overrides.items():
        raw[section] = {**(raw.get(section) or {}), **values} if isinstance(values, dict) else values
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def start_daemon(base: Path, workdir: Path, client_id: str, overrides: dict, address: str, log: Path,
                 pythonpath: Optional[Path] = None, session: bool = False,
                 preexec: Optional[Callable[[], None]] = None) -> ConsumerProcess:
    """`edge-inferd run` on a bench copy of `base` (write_bench_config), once it is online at `address`.
    `pythonpath`: put first on the child's PYTHONPATH (a script run from a checkout passes its root).
    `session`: keep the config's session, and end it once the daemon has stopped."""
    config = write_bench_config(base, workdir, client_id, overrides, session)
    cmd = [sys.executable, "-m", "daemon", "run", "--config", str(config), "--broker", address]
    env = None
    if pythonpath is not None:
        env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(pythonpath), os.environ.get("PYTHONPATH")]))}
    after = (lambda: end_session(address, client_id)) if session else None
    return ConsumerProcess(cmd, address, f"edge-inferd/{client_id}/status", log, env=env, after_stop=after,
                           preexec=preexec)


def activity_lines(config_path: Path) -> tuple[list[bytes], np.ndarray]:
    """The activity test samples as JSON nested lists (as users send them), and the raw array."""
    config = load_config(config_path)
    with np.load(config.models["activity"].path.parent / "test.npz", allow_pickle=False) as data:
        x = data["x"].astype(np.float32)
    return [json.dumps(s.tolist()).encode() for s in x], x


def raw_reply_topic(config_path: Path) -> Optional[str]:
    """Where the batching phase's replies go: the reply topic of the config's route of model
    RAW_ROUTE_MODEL that takes RAW_TOPIC (None: the config has none, the phase is skipped)."""
    for route in load_config(config_path).routes:
        captures = topics.match(route.subscribe, RAW_TOPIC)
        if route.model == RAW_ROUTE_MODEL and captures is not None:
            return topics.render(route.publish, RAW_TOPIC, captures)
    return None


class Bench:
    """Owns the broker address, the collector, the temp dir and the results."""

    def __init__(self, address: str, workdir: Path, plan: Plan, reply_filters: Sequence[str] = (REPLY_FILTER,),
                 preexec: Optional[Callable[[], None]] = None):
        self.address = address
        self.preexec = preexec  # run in each consumer's child (cpus.Placement)
        self.workdir = workdir
        self.plan = plan
        self.collector = Collector(address, *reply_filters)
        self.results: dict = {phase: {} for phase in plan.phases}
        self._next_id = 0
        self._started = 0

    def ids(self, n: int) -> range:
        """Fresh request ids: a late reply to an earlier measurement is never counted twice."""
        first, self._next_id = self._next_id, self._next_id + n
        return range(first, first + n)

    def start(self, consumer: Consumer) -> ConsumerProcess:
        self._started += 1
        client_id = f"bench-{consumer.name}-{self._started}"
        workdir = self.workdir / client_id
        workdir.mkdir()
        logger.info("starting %s", consumer.name)
        log = workdir / "consumer.log"
        if consumer.kind == "daemon":
            overrides = consumer.overrides
            if self.plan.transport is not None:
                overrides = {**overrides, "mqtt": {**overrides.get("mqtt", {}), "transport": self.plan.transport}}
            return start_daemon(self.plan.config, workdir, client_id, overrides, self.address, log,
                                session=consumer.session, preexec=self.preexec)
        cmd = [sys.executable, "-m", "daemon.tools.baselines", consumer.kind, "--broker", self.address,
               "--config", str(self.plan.config), "--route", self.plan.route, "--client-id", client_id,
               *consumer.args]
        return ConsumerProcess(cmd, self.address, f"edge-inferd/{client_id}/status", log, preexec=self.preexec)

    def warm(self, pub: LinePublisher, line: Callable[[int], bytes]) -> None:
        """Negative ids: end-to-end readiness (publisher connected, consumer subscribed) and warm-up."""
        before = self.collector.probes
        for k in range(self.plan.warmup):
            pub.send(line(-1 - k))
        if not self.collector.wait(lambda: self.collector.probes - before >= self.plan.warmup,
                                   _WARMUP_TIMEOUT_S):
            raise DaemonError(f"warm-up requests were not answered within {_WARMUP_TIMEOUT_S:.0f}s")

    def drain(self, consumer: ConsumerProcess, line: Callable[[int], bytes], topic: str, n: int) -> dict:
        """Burst n requests through `mosquitto_pub -l`; rate, CPU per answered request, counts."""
        ids = self.ids(n)
        path = self.workdir / "burst.jsonl"
        with open(path, "wb") as f:
            for i in ids:
                f.write(line(i))
        pub = LinePublisher(self.address, topic)
        try:
            self.warm(pub, line)
            cpu0, start = consumer.cpu_s(), time.perf_counter()
            writer = threading.Thread(target=pub.send_file, args=(path,), daemon=True)
            writer.start()
            by_id = self.collector.by_id
            self.collector.settle(lambda: all(i in by_id for i in ids), self.plan.settle, busy=writer.is_alive)
            cpu = consumer.cpu_s() - cpu0
            writer.join()
        finally:
            pub.close()
        return drain_summary(outcome(self.collector, ids).summary(), start, last_reply(self.collector, ids), cpu)

    def paced(self, proc: ConsumerProcess, topic: str, rate: float, duration: float, line: Callable[[int], bytes],
              extra: tuple[str, ...] = ()) -> tuple[dict, "PacedRun"]:
        """Open loop: request k is written to mosquitto_pub's stdin at start + k / rate (`extra`: its
        options, e.g. a message expiry). The summary, and when each request went and came back."""
        ids = self.ids(max(1, int(rate * duration)))
        sent_at: dict[int, float] = {}
        pub = LinePublisher(self.address, topic, extra)
        try:
            self.warm(pub, line)
            cpu0, start = proc.cpu_s(), time.perf_counter()
            for k, i in enumerate(ids):
                delay = start + k / rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                sent_at[i] = time.perf_counter()
                pub.send(line(i))
            sent_s = time.perf_counter() - start
            self.collector.settle(lambda: all(i in self.collector.by_id for i in ids), self.plan.settle)
            cpu = proc.cpu_s() - cpu0
        finally:
            pub.close()
        point = outcome(self.collector, ids, sent_at).summary()
        point.update(rate=round(rate, 1), offered_rps=round(len(ids) / max(sent_s, 1e-9), 1),
                     duration_s=duration, cpu_us_per_request=round(cpu / max(point["answered"], 1) * 1e6, 1))
        return point, PacedRun(ids, sent_at, start, sent_s)

    def close(self) -> None:
        self.collector.close()


@dataclass(frozen=True)
class PacedRun:
    ids: range
    sent_at: dict  # request id -> time.perf_counter() when it was written
    start: float
    sent_s: float  # how long the sending took


class Phases:
    def __init__(self, bench: Bench, consumers: Sequence[Consumer], wait500: Consumer, cache: Consumer,
                 workload: Workload):
        self.bench = bench
        self.plan = bench.plan
        self.consumers, self.wait500, self.cache = consumers, wait500, cache
        self.workload = workload
        self.topic = workload.request_topic
        self.capacity = {}  # consumer name -> drain req/s
        self.rng = np.random.default_rng(SEED)
        self.raw_route = raw_reply_topic(self.plan.config) is not None
        if "batching" in self.plan.phases and not self.raw_route:
            bench.results.setdefault("errors", {})["batching"] = (
                f"skipped: no route of model {RAW_ROUTE_MODEL!r} subscribes to {RAW_TOPIC} in {self.plan.config}")

    def line(self, request_id: int) -> bytes:
        return self.workload.line(request_id)

    def run(self) -> None:
        phases = self.plan.phases
        for consumer in self.consumers:
            if not ({"drain", "openloop"} & set(phases) or ("batching" in phases and consumer.kind == "daemon")):
                continue
            try:
                proc = self.bench.start(consumer)
                try:
                    self._per_consumer(consumer, proc)
                finally:
                    proc.stop()
            except DaemonError as exc:  # record it and go on with the other consumers
                logger.warning("%s: %s", consumer.name, exc)
                self.bench.results.setdefault("errors", {})[consumer.name] = str(exc)
        if "openloop" in phases:
            self._wait500()
        if "cache" in phases:
            self._cache()

    def _per_consumer(self, consumer: Consumer, proc: ConsumerProcess) -> None:
        results = self.bench.results
        if "drain" in results:
            logger.info("drain: %s, %d requests", consumer.name, self.plan.requests)
            results["drain"][consumer.name] = self.bench.drain(proc, self.line, self.topic, self.plan.requests)
            self.capacity[consumer.name] = results["drain"][consumer.name]["rps"]
        # Batching before the open loop: past capacity a backlog builds up in the broker, and
        # the consumer is still working it off when the open loop's last point ends.
        if "batching" in results and consumer.kind == "daemon" and self.raw_route:
            logger.info("batching: %s, %d raw appliance requests", consumer.name, self.plan.requests)
            results["batching"][consumer.name] = self._raw_drain(proc)
        if "openloop" in results:
            results["openloop"][consumer.name] = [self._paced_point(proc, consumer, text)
                                                  for text in self.plan.rates]

    def reference_capacity(self) -> float:
        """The batching-off daemon's drain rate: the unit of "Nx" rates."""
        first_daemon = next(c.name for c in self.consumers if c.kind == "daemon")
        return self.capacity.get(first_daemon) or max(self.capacity.values(), default=1000.0)

    def _paced_point(self, proc: ConsumerProcess, consumer: Consumer, text: str) -> dict:
        rate, multiple = parse_rate(text, self.reference_capacity())
        duration = self.plan.duration * (LONG_DURATION_FACTOR if multiple >= LONG_RATE_MULTIPLE else 1.0)
        logger.info("open loop: %s at %.0f req/s (%s) for %.1fs", consumer.name, rate, text, duration)
        point = self.paced(proc, rate, duration, self.line)
        point["rate_spec"] = text
        return point

    def paced(self, proc: ConsumerProcess, rate: float, duration: float, line: Callable[[int], bytes]) -> dict:
        return self.bench.paced(proc, self.topic, rate, duration, line)[0]

    def _wait500(self) -> None:
        on = next((c.name for c in self.consumers if c.overrides == self.wait500.overrides), None)
        rate = 2.0 * (self.capacity.get(on) or self.reference_capacity())
        proc = self.bench.start(self.wait500)
        try:
            duration = self.plan.duration * LONG_DURATION_FACTOR
            logger.info("open loop: %s at %.0f req/s (2x) for %.1fs", self.wait500.name, rate, duration)
            point = self.paced(proc, rate, duration, self.line)
        finally:
            proc.stop()
        point["rate_spec"] = "2x"
        self.bench.results["openloop"][self.wait500.name] = [point]

    def unique_samples(self, n: int) -> list[bytes]:
        return self.workload.fresh(n, self.rng)

    def _cache(self) -> None:
        proc = self.bench.start(self.cache)
        try:
            self.bench.results["cache"] = self._cache_streams(proc)
        finally:
            proc.stop()

    def _cache_streams(self, proc: ConsumerProcess) -> dict:
        rate = min(CACHE_RATE_MAX, CACHE_RATE_MULTIPLE * self.reference_capacity())
        n_mixed = max(1, int(rate * self.plan.duration))
        uniques = self.unique_samples(n_mixed)
        mixed_ids = self.bench.ids(0).start  # the next ids the paced stream will get
        order: list[int] = []  # a repeat is an exact repeat of an earlier request (so popular data repeats more)
        for k in range(n_mixed):
            order.append(k if k == 0 or self.rng.random() >= REPEAT_SHARE else order[int(self.rng.integers(0, k))])
        logger.info("cache: mixed stream, %d requests at %.0f req/s, %.0f%% repeats", n_mixed, rate,
                    REPEAT_SHARE * 100)
        mixed = self.paced(proc, rate, self.plan.duration,
                           lambda i: json_line(i, uniques[order[i - mixed_ids]]) if i >= 0 else self.line(i))
        mixed["repeats_sent"] = sum(1 for k, o in enumerate(order) if o != k)
        fresh = self.unique_samples(self.plan.requests)
        logger.info("cache: %d unique requests, then the same data twice more with new ids", self.plan.requests)
        unique = self.bench.drain(proc, self._stream(fresh), self.topic, self.plan.requests)
        # The cache stores a result only for an input seen before: the second pass is admitted, the third hits.
        second = self.bench.drain(proc, self._stream(fresh), self.topic, self.plan.requests)
        repeat = self.bench.drain(proc, self._stream(fresh), self.topic, self.plan.requests)
        return {"rate": round(rate, 1), "mixed": mixed, "all_unique": unique, "second_sighting": second,
                "all_repeat": repeat}

    def _stream(self, data: list[bytes]) -> Callable[[int], bytes]:
        first = self.bench.ids(0).start

        def line(i: int) -> bytes:
            return json_line(i, data[(i - first) % len(data)]) if i >= 0 else self.line(i)
        return line

    def _raw_drain(self, proc: ConsumerProcess) -> dict:
        """appliance-raw at saturation: binary payloads from a paho publisher with a wide window."""
        config = load_config(self.plan.config)
        with np.load(config.models[RAW_ROUTE_MODEL].path.parent / "test.npz", allow_pickle=False) as data:
            x = data["x"].astype("<f4")
        n = self.plan.requests
        path = self.bench.workdir / "raw.bin"
        path.write_bytes(b"".join(x[i % len(x)].tobytes() for i in range(RAW_WARMUP + n)))
        cmd = [sys.executable, "-m", "daemon.tools.baselines", "rawpub", "--broker", self.bench.address, "--topic",
               RAW_TOPIC, "--file", str(path), "--size", str(x[0].nbytes), "--warmup", str(RAW_WARMUP)]
        pub = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            return self._time_raw(proc, pub, n)
        finally:
            if pub.poll() is None:
                pub.kill()
                pub.wait()

    def _time_raw(self, proc: ConsumerProcess, pub: subprocess.Popen, n: int) -> dict:
        replies = self.bench.collector.anonymous
        mark = len(replies)
        if pub.stdout.readline().strip() != b"ready" or not self.bench.collector.wait(
                lambda: len(replies) - mark >= RAW_WARMUP, _RAWPUB_TIMEOUT_S):
            raise DaemonError("the raw publisher's warm-up requests were not answered")
        mark = len(replies)
        cpu0, start = proc.cpu_s(), time.perf_counter()
        pub.stdin.write(b"go\n")
        pub.stdin.flush()
        self.bench.collector.settle(lambda: len(replies) - mark >= n, self.plan.settle)
        cpu = proc.cpu_s() - cpu0
        published = json.loads(pub.communicate(timeout=_RAWPUB_TIMEOUT_S)[0] or b"{}")
        got = replies[mark : mark + n]
        result = Outcome(n)
        for reply in got:
            result.counts[reply.kind] = result.counts.get(reply.kind, 0) + 1
        summary = drain_summary(result.summary(), start, got[-1].at if got else start, cpu)
        summary["publisher_rps"] = round(published.get("published", 0) / max(published.get("seconds", 0), 1e-9), 1)
        return summary
