"""Counters, a latency reservoir and per-stage histograms.

The stats topic (stats_topic.py) and the Prometheus exporter (prometheus.py) read `Stats.snapshot()`.
Stage timings (queue wait per request; decode, preprocess, infer, postprocess and
publish per batch) and batch sizes go into fixed buckets: one bisect and two adds
under the lock, and buckets, unlike a reservoir, can feed Prometheus histograms.
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter, deque
from types import MappingProxyType
from typing import Mapping, Sequence

import numpy as np

_MS = 1000.0
# Recent latencies kept for percentiles: enough for a stable p99, bounded memory.
_LATENCY_WINDOW = 4096
# Upper bounds of the stage-time buckets, in seconds (10 us .. 10 s, roughly x2.5 apart).
STAGE_BUCKETS_S = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2,
                   0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Upper bounds of the batch-size buckets.
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
# The outcome of a request answered with a result; any other outcome is an error code.
RESULT = "result"
RESULTS = "results"  # the counter of result outcomes
ERROR_PREFIX = "errors."


class Stats:
    """Thread-safe named counters plus recent end-to-end latencies.

    `incr` takes no lock: each thread adds to its own dict (one per thread, registered once),
    and readers sum them. Only the owning thread writes a dict; a reader copies it with
    `dict(...)`, one C call under the GIL, so it sees each counter before or after an
    increment, never a torn one. `record` (a batch's counts at once) keeps the lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._local = threading.local()
        self._shards: list[dict[str, int]] = []  # every thread's own counters; kept after it ends
        self._latency_ms: deque[float] = deque(maxlen=_LATENCY_WINDOW)
        self._stages: dict[str, Histogram] = {}
        self._batches = Histogram(BATCH_BUCKETS)
        self._outcomes: Counter[tuple[str, str]] = Counter()  # (route, result | error code)
        self._duration = Histogram(STAGE_BUCKETS_S)  # end-to-end seconds of results
        self._http: Counter[tuple[str, int]] = Counter()  # (route, HTTP status): the listener's requests

    def incr(self, name: str, n: int = 1) -> None:
        try:
            shard = self._local.counts
        except AttributeError:
            shard = self._new_shard()
        shard[name] = shard.get(name, 0) + n

    def _new_shard(self) -> dict[str, int]:
        """This thread's counters, made on its first `incr`."""
        shard: dict[str, int] = {}
        with self._lock:
            self._shards.append(shard)
        self._local.counts = shard
        return shard

    def record(self, counts: Mapping[str, int], latencies_ms: Sequence[float] = (),
               outcomes: Mapping[tuple[str, str], int] = MappingProxyType({})) -> None:
        """A batch's counters, result latencies and (route, outcome) counts under one lock.

        Outcomes are `result` or an error code; `results` and `errors.<code>` are summed from
        them when read, so a reply is counted once."""
        with self._lock:
            self._counts.update(counts)
            self._latency_ms.extend(latencies_ms)
            self._outcomes.update(outcomes)
            for ms in latencies_ms:
                self._duration.add(ms / _MS)

    def count_http(self, route: str, status: int) -> None:
        """One HTTP request answered (daemon/transport/http_server.py): its route ("" for none) and status."""
        with self._lock:
            self._http[(route, status)] += 1

    def http_counts(self) -> dict:
        """{route: {status: n}} of the HTTP listener's requests ({} while it served none)."""
        with self._lock:
            pairs = list(self._http.items())
        out: dict = {}
        for (route, status), n in sorted(pairs):
            out.setdefault(route, {})[str(status)] = n
        return out

    def histograms(self) -> dict:
        """Copies for an exporter: outcomes by (route, outcome), request duration, stages, batch size,
        HTTP requests by (route, status)."""
        with self._lock:
            return {"outcomes": dict(self._outcomes), "duration": self._duration.copy(), "http": dict(self._http),
                    "stages": {name: h.copy() for name, h in self._stages.items()}, "batch": self._batches.copy()}

    def observe_stage(self, stage: str, seconds: float) -> None:
        self.observe_stages(stage, (seconds,))

    def observe_stages(self, stage: str, values: Sequence[float]) -> None:
        with self._lock:
            histogram = self._stages.get(stage)
            if histogram is None:
                histogram = self._stages[stage] = Histogram(STAGE_BUCKETS_S)
            for seconds in values:
                histogram.add(seconds)

    def observe_batch(self, size: int) -> None:
        with self._lock:
            self._batches.add(size)

    def count(self, name: str) -> int:
        with self._lock:
            return self._all_counts()[name]

    def _all_counts(self) -> Counter[str]:
        """The counters and every thread's own, plus `results` and `errors.<code>` summed from the
        outcomes (lock held)."""
        counts = Counter(self._counts)
        for shard in self._shards:
            counts.update(dict(shard))  # the copy is atomic; its thread may be adding meanwhile
        for (_, outcome), n in self._outcomes.items():
            counts[RESULTS if outcome == RESULT else f"{ERROR_PREFIX}{outcome}"] += n
        return counts

    def snapshot(self) -> dict:
        with self._lock:
            counts = dict(self._all_counts())
            lat = np.array(self._latency_ms, dtype=np.float64)
            stages = {name: h.summary(scale=_MS) for name, h in self._stages.items()}
            batches = self._batches.summary()
        out: dict = {"counts": counts, "stages_ms": stages, "batch_size": batches}
        if lat.size:
            out["latency_ms"] = {"p50": round(float(np.percentile(lat, 50)), 3),
                                 "p99": round(float(np.percentile(lat, 99)), 3), "n": int(lat.size)}
        return out


class Histogram:
    """Counts per bucket (upper bounds, plus +inf), sum and count. Not locked: Stats locks it."""

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0
        self.n = 0

    def add(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.n += 1

    def copy(self) -> "Histogram":
        twin = Histogram(self.bounds)
        twin.counts, twin.total, twin.n = list(self.counts), self.total, self.n
        return twin

    def quantile(self, q: float) -> float:
        """Upper bound of the bucket holding the q-quantile (inf when past the last bound)."""
        rank = q * self.n
        seen = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts):
            seen += count
            if seen >= rank:
                return bound
        return float("inf")

    def summary(self, scale: float = 1.0) -> dict:
        if not self.n:
            return {"n": 0}
        return {"n": self.n, "mean": round(self.total / self.n * scale, 4),
                "p50_le": self.quantile(0.5) * scale, "p99_le": self.quantile(0.99) * scale}
