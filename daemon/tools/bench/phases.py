"""The phases of `bench e2e`: drain, open loop, cache-hit path, batching on the heavier model.

Each consumer process is started once and runs every phase that concerns it, so the
consumers see the same requests in the same order.
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

from daemon.tools.bench.load import Collector, ConsumerProcess, LinePublisher, Outcome, drain_summary, json_line, last_reply, outcome
from daemon.config.loader import load_config
from daemon.tools.bench.plan import Plan, parse_rate
from daemon.config.reader import absolute_paths
from daemon.errors import DaemonError


logger = logging.getLogger(__name__)

REQUEST_TOPIC = "sensors/bench/imu"
RAW_TOPIC = "plugs/bench/power/raw"
RAW_ROUTE_MODEL = "appliance"
RAW_WARMUP = 50
# Share of the mixed cache stream that repeats earlier data exactly (with a new id).
REPEAT_SHARE = 0.2
CACHE_RATE_MULTIPLE = 0.5  # the mixed cache stream is paced at this multiple of capacity...
CACHE_RATE_MAX = 1000.0  # ...but no faster than this (req/s)
# Noise (sensor units) that makes each "unique" sample a distinct cache key. The key is the
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


def write_bench_config(base: Path, workdir: Path, client_id: str, overrides: dict) -> Path:
    """A copy of `base` with absolute model paths, a private cache dir, and `overrides` per section."""
    raw = absolute_paths(yaml.safe_load(base.read_text()), base.parent)
    raw["cache"] = {**(raw.get("cache") or {}), "dir": str(workdir / "cache")}
    # A clean session: a stopped consumer's persistent session would stay subscribed to the
    # shared request topic and make the broker queue every later request for it too.
    raw["mqtt"] = {**(raw.get("mqtt") or {}), "client_id": client_id, "session_expiry_s": 0}
    for section, values in overrides.items():
        raw[section] = {**(raw.get(section) or {}), **values} if isinstance(values, dict) else values
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def start_daemon(base: Path, workdir: Path, client_id: str, overrides: dict, address: str, log: Path,
                 pythonpath: Optional[Path] = None) -> ConsumerProcess:
    """`edge-inferd run` on a bench copy of `base` (write_bench_config), once it is online at `address`.
    `pythonpath`: put first on the child's PYTHONPATH (a script run from a checkout passes its root)."""
    config = write_bench_config(base, workdir, client_id, overrides)
    cmd = [sys.executable, "-m", "daemon", "run", "--config", str(config), "--broker", address]
    env = None
    if pythonpath is not None:
        env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(pythonpath), os.environ.get("PYTHONPATH")]))}
    return ConsumerProcess(cmd, address, f"edge-inferd/{client_id}/status", log, env=env)


def activity_lines(config_path: Path) -> tuple[list[bytes], np.ndarray]:
    """The activity test samples as JSON nested lists (as users send them), and the raw array."""
    config = load_config(config_path)
    with np.load(config.models["activity"].path.parent / "test.npz", allow_pickle=False) as data:
        x = data["x"].astype(np.float32)
    return [json.dumps(s.tolist()).encode() for s in x], x


class Bench:
    """Owns the broker address, the collector, the temp dir and the results."""

    def __init__(self, address: str, workdir: Path, plan: Plan):
        self.address = address
        self.workdir = workdir
        self.plan = plan
        self.collector = Collector(address, REPLY_FILTER)
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
            return start_daemon(self.plan.config, workdir, client_id, consumer.overrides, self.address, log)
        cmd = [sys.executable, "-m", "daemon.tools.baselines", consumer.kind, "--broker", self.address,
               "--config", str(self.plan.config), "--client-id", client_id]
        return ConsumerProcess(cmd, self.address, f"edge-inferd/{client_id}/status", log)

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
            self.collector.settle(lambda: all(i in by_id for i in ids), self.plan.settle)
            cpu = consumer.cpu_s() - cpu0
            writer.join()
        finally:
            pub.close()
        return drain_summary(outcome(self.collector, ids).summary(), start, last_reply(self.collector, ids), cpu)

    def close(self) -> None:
        self.collector.close()


class Phases:
    def __init__(self, bench: Bench, consumers: Sequence[Consumer], wait500: Consumer, cache: Consumer):
        self.bench = bench
        self.plan = bench.plan
        self.consumers, self.wait500, self.cache = consumers, wait500, cache
        self.samples, self.x = activity_lines(self.plan.config)
        self.capacity = {}  # consumer name -> drain req/s
        self.rng = np.random.default_rng(SEED)

    def line(self, request_id: int) -> bytes:
        return json_line(request_id, self.samples[request_id % len(self.samples)])

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
            results["drain"][consumer.name] = self.bench.drain(proc, self.line, REQUEST_TOPIC, self.plan.requests)
            self.capacity[consumer.name] = results["drain"][consumer.name]["rps"]
        # Batching before the open loop: past capacity a backlog builds up in the broker, and
        # the consumer is still working it off when the open loop's last point ends.
        if "batching" in results and consumer.kind == "daemon":
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
        """Open loop: request k is written to mosquitto_pub's stdin at start + k / rate."""
        ids = self.bench.ids(max(1, int(rate * duration)))
        sent_at: dict[int, float] = {}
        collector = self.bench.collector
        pub = LinePublisher(self.bench.address, REQUEST_TOPIC)
        try:
            self.bench.warm(pub, line)
            cpu0, start = proc.cpu_s(), time.perf_counter()
            for k, i in enumerate(ids):
                delay = start + k / rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                sent_at[i] = time.perf_counter()
                pub.send(line(i))
            sent_s = time.perf_counter() - start
            collector.settle(lambda: all(i in collector.by_id for i in ids), self.plan.settle)
            cpu = proc.cpu_s() - cpu0
        finally:
            pub.close()
        point = outcome(collector, ids, sent_at).summary()
        point.update(rate=round(rate, 1), offered_rps=round(len(ids) / max(sent_s, 1e-9), 1),
                     duration_s=duration, cpu_us_per_request=round(cpu / max(point["answered"], 1) * 1e6, 1))
        return point

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
        picks = self.x[np.arange(n) % len(self.x)]
        noisy = picks + self.rng.normal(0.0, NOISE_STD, picks.shape).astype(np.float32)
        return [json.dumps(s.tolist()).encode() for s in noisy]

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
        order = [k if k == 0 or self.rng.random() >= REPEAT_SHARE else int(self.rng.integers(0, k))
                 for k in range(n_mixed)]
        logger.info("cache: mixed stream, %d requests at %.0f req/s, %.0f%% repeats", n_mixed, rate,
                    REPEAT_SHARE * 100)
        mixed = self.paced(proc, rate, self.plan.duration,
                           lambda i: json_line(i, uniques[order[i - mixed_ids]] if i >= 0 else self.samples[0]))
        mixed["repeats_sent"] = sum(1 for k, o in enumerate(order) if o != k)
        fresh = self.unique_samples(self.plan.requests)
        logger.info("cache: %d unique requests, then the same data again with new ids", self.plan.requests)
        unique = self.bench.drain(proc, self._stream(fresh), REQUEST_TOPIC, self.plan.requests)
        repeat = self.bench.drain(proc, self._stream(fresh), REQUEST_TOPIC, self.plan.requests)
        return {"rate": round(rate, 1), "mixed": mixed, "all_unique": unique, "all_repeat": repeat}

    def _stream(self, data: list[bytes]) -> Callable[[int], bytes]:
        first = self.bench.ids(0).start

        def line(i: int) -> bytes:
            return json_line(i, data[(i - first) % len(data)] if i >= 0 else self.samples[0])
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
