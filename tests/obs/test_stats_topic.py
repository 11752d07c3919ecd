"""The stats payload's rounding, its readable one-line form for the log, and the stop line read back."""

from __future__ import annotations

import json

import numpy as np
import pytest

from daemon.obs import stats_topic


class _Cache:
    def snapshot(self) -> dict:
        return {"hits": 1, "disk_hits": 0, "misses": 7, "hit_rate": 0.125}


def _snapshot(**overrides) -> dict:
    stats = {"counts": {"received": 1234, "errors.bad_payload": 4, "errors.overloaded": 9},
             "latency_ms": {"p50": 1.234, "p99": 7.5565, "n": 1230},
             "stages_ms": {"queue": {"n": 3, "mean": 0.3076, "p50_le": 1e-5 * 1000.0, "p99_le": 2.5}}}
    stats.update(overrides)
    return stats_topic.payload(stats, 12.345, {"activity": "d65608b0fb45" * 5}, 2, {"depth": 3, "busy": 1},
                              _Cache(), 2, {"unconfirmed": 1, "stored": 5})


def test_floats_are_rounded():
    snapshot = _snapshot()
    assert snapshot["latency_ms"]["stages"]["queue"]["p50_le"] == 0.01  # was 0.010000000000000002
    assert snapshot["latency_ms"]["p99"] == 7.5565 and snapshot["uptime_s"] == 12.3


def test_summary_line_is_readable():
    assert stats_topic.summary_line(_snapshot()) == (
        "stats: received 1234, results 0, errors overloaded=9 bad_payload=4, cache hit 12%, queue 3, "
        "p50 1.2 ms p99 7.6 ms, outbox 6, reconnects 2")


def test_summary_line_before_any_request():
    snapshot = stats_topic.payload({}, 0.0, {}, 1)
    assert stats_topic.summary_line(snapshot) == (
        "stats: received 0, results 0, errors 0, cache off, queue 0, no latency yet, outbox 0, reconnects 0")


def test_workers_carry_the_running_count_its_bounds_and_the_scale_counts():
    scaling = {"min": 1, "max": 4, "scale_ups": 3, "scale_downs": 2}
    snapshot = stats_topic.payload({}, 0.0, {}, 2, {"depth": 0, "busy": 1}, scaling=scaling)
    assert snapshot["workers"] == {"threads": 2, "busy": 1, "min": 1, "max": 4, "scale_ups": 3, "scale_downs": 2}


def test_the_cache_section_carries_admission_counts_to_the_stats_and_prometheus(tmp_path):
    """The real cache's snapshot: the stats topic takes it whole; Prometheus names each counter."""
    pytest.importorskip("prometheus_client")
    from daemon.cache.result_cache import ResultCache
    from daemon.config.schema import CacheConfig
    from daemon.obs.prometheus import StatsCollector
    from daemon.obs.stats import Stats

    cache = ResultCache(CacheConfig(dir=tmp_path / "c", memory_mb=1))
    key = b"k" * 16
    cache.put_many([(key, np.ones(3, np.float32))])  # refused: first sighting
    cache.put_many([(key, np.ones(3, np.float32))])  # admitted
    cache.get_many([key, b"n" * 16])
    payload = stats_topic.payload(_snapshot(), 1.0, {}, 0, {}, cache, 0, {})
    assert (payload["cache"]["admitted"], payload["cache"]["refused"]) == (1, 1)
    families = {f.name: f for f in StatsCollector(Stats(), dict, dict, cache.snapshot).collect()}
    assert {s.labels["decision"]: s.value for s in families["edge_inferd_cache_admissions"].samples} == {
        "admitted": 1, "refused": 1}
    assert {s.labels["result"]: s.value for s in families["edge_inferd_cache_lookups"].samples} == {
        "hit": 1, "disk_hit": 0, "miss": 1}
    cache.close()
    assert "edge_inferd_cache_lookups" not in {f.name for f in StatsCollector(Stats(), dict).collect()}


def test_stopped_stats_reads_back_the_last_stop_line_of_a_log():
    first, last = {"received": 1, "errors": {}}, {"received": 2, "errors": {"overloaded": 1}}
    log = "\n".join([
        "2026-12-02T00:00:00.000 INFO daemon.lifecycle.service: " + stats_topic.STOPPED_PREFIX + json.dumps(first),
        "2026-12-02T00:00:01.000 INFO daemon.lifecycle.service: start-up: models",
        "[w0] 2026-12-02T00:00:02.000 INFO daemon.lifecycle.service: " + stats_topic.STOPPED_PREFIX + json.dumps(last),
    ])
    assert stats_topic.stopped_stats(log) == last
    assert stats_topic.stopped_stats("start-up: models\n") is None  # it did not stop cleanly
