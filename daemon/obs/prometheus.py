"""An optional Prometheus endpoint (`metrics.port`), read from the daemon's stats at scrape time.

One custom collector declares every metric once, with fixed names and labels, and reads
`Stats` (counters and bucketed histograms: a reservoir of samples could not feed a
Prometheus histogram) and the queue when Prometheus scrapes. Nothing is added to the
request path. Names follow Prometheus conventions: `_total` counters, `_seconds`
histograms.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from daemon.obs.stats import Histogram, Stats

logger = logging.getLogger(__name__)

PREFIX = "edge_inferd"


def _buckets(h: Histogram) -> list[tuple[str, int]]:
    """Cumulative (upper bound, count) pairs, as Prometheus histograms carry them."""
    cumulative, out = 0, []
    for bound, count in zip((*h.bounds, float("inf")), h.counts):
        cumulative += count
        out.append(("+Inf" if bound == float("inf") else repr(float(bound)), cumulative))
    return out


def _histogram(name: str, doc: str, h: Histogram) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc)
    family.add_metric([], _buckets(h), h.total)
    return family


class StatsCollector:
    """Turns Stats (and the queue gauges) into metric families on every scrape."""

    def __init__(self, stats: Stats, queue: Callable[[], dict], models: Callable[[], dict] = dict,
                 cache: Callable[[], dict] = dict, drift: Callable[[], dict] = dict):
        self._stats = stats
        self._queue = queue
        self._models = models  # daemon/model/residency.py Residency.state(): loaded, cold starts by model
        self._cache = cache  # daemon/cache/result_cache.py ResultCache.snapshot(), {} when off
        self._drift = drift  # daemon/obs/drift.py DriftMonitor.snapshot(): the PSIs, computed at the scrape

    def collect(self) -> Iterator:
        h = self._stats.histograms()
        requests = CounterMetricFamily(f"{PREFIX}_requests", "Requests answered, by route and outcome "
                                       "(result or an error code)", labels=["route", "outcome"])
        for (route, outcome), n in sorted(h["outcomes"].items()):
            requests.add_metric([route, outcome], n)
        yield requests
        http = CounterMetricFamily(f"{PREFIX}_http_requests", "HTTP listener requests (http.port), by route "
                                   "(empty: none named) and status code", labels=["route", "code"])
        for (route, status), n in sorted(h.get("http", {}).items()):
            http.add_metric([route, str(status)], n)
        yield http
        yield _histogram(f"{PREFIX}_request_duration_seconds", "Receipt to reply of results", h["duration"])
        stages = HistogramMetricFamily(f"{PREFIX}_stage_seconds", "Time per stage (queue wait per request; "
                                       "the others per batch)", labels=["stage"])
        for name, stage in sorted(h["stages"].items()):
            stages.add_metric([name], _buckets(stage), stage.total)
        yield stages
        yield _histogram(f"{PREFIX}_batch_size", "Requests per batch a worker took", h["batch"])
        queue = self._queue()
        for key, doc in (("depth", "Requests queued"), ("busy", "Workers busy"), ("bytes", "Bytes queued")):
            gauge = GaugeMetricFamily(f"{PREFIX}_queue_{key}", doc)
            gauge.add_metric([], queue.get(key, 0))
            yield gauge
        yield from self._residency()
        yield from self._cache_metrics()
        yield from self._drift_metrics()

    def _drift_metrics(self) -> Iterator:
        psi = GaugeMetricFamily(f"{PREFIX}_drift_psi", "Population stability index of the route's last answers "
                                "against its reference, by measure (labels: top-1 label shares, score: the "
                                "score histogram); absent until the window holds drift.min_answers",
                                labels=["route", "measure"])
        answers = GaugeMetricFamily(f"{PREFIX}_drift_window_answers", "Answers in the route's drift window",
                                    labels=["route"])
        drifting = GaugeMetricFamily(f"{PREFIX}_drift_warning", "1 while the route's PSI is past "
                                     "drift.warn_above (a warning episode), else 0", labels=["route"])
        for route, state in sorted(self._drift().items()):
            for measure, value in sorted((state.get("psi") or {}).items()):
                psi.add_metric([route, measure], value)
            answers.add_metric([route], state.get("answers", 0))
            drifting.add_metric([route], 1 if state.get("drifting") else 0)
        yield psi
        yield answers
        yield drifting

    def _cache_metrics(self) -> Iterator:
        snapshot = self._cache()
        if "hits" not in snapshot:
            return  # the cache is off
        lookups = CounterMetricFamily(f"{PREFIX}_cache_lookups", "Cache lookups by where they were "
                                      "answered (memory, disk) or a miss", labels=["result"])
        for result, key in (("hit", "hits"), ("disk_hit", "disk_hits"), ("miss", "misses")):
            lookups.add_metric([result], snapshot.get(key, 0))
        yield lookups
        offers = CounterMetricFamily(f"{PREFIX}_cache_admissions", "Computed results offered to the cache: "
                                     "admitted (the input was seen before) or refused", labels=["decision"])
        for decision in ("admitted", "refused"):
            offers.add_metric([decision], snapshot.get(decision, 0))
        yield offers
        entries = GaugeMetricFamily(f"{PREFIX}_cache_entries", "Entries in the memory tier")
        entries.add_metric([], snapshot.get("entries", 0))
        yield entries

    def _residency(self) -> Iterator:
        loaded = GaugeMetricFamily(f"{PREFIX}_model_loaded", "1 while any worker holds the model's "
                                   "interpreters, 0 once unloaded after workers.idle_unload_s", labels=["model"])
        cold = CounterMetricFamily(f"{PREFIX}_model_cold_starts", "Loads of a model after an idle unload",
                                   labels=["model"])
        for name, state in sorted(self._models().items()):
            loaded.add_metric([name], 1 if state["loaded"] else 0)
            cold.add_metric([name], state["cold_starts"])
        yield loaded
        yield cold



def serve(port: int, address: str, stats: Stats, queue: Callable[[], dict],
          models: Callable[[], dict] = dict, cache: Callable[[], dict] = dict,
          drift: Callable[[], dict] = dict) -> None:
    """Start the endpoint on its own daemon thread (prometheus_client's HTTP server)."""
    registry = CollectorRegistry()
    registry.register(StatsCollector(stats, queue, models, cache, drift))
    start_http_server(port, addr=address, registry=registry)
    logger.info("Prometheus metrics on http://%s:%d/metrics", address, port)
