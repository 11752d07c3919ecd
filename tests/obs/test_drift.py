"""Drift (daemon/obs/drift.py): the PSI, the sliding window, references, and the once-per-episode warning."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from daemon.config.drift import DriftConfig
from daemon.obs.drift import (FROM_FIRST_ANSWERS, FROM_VALIDATE, PSI_EPSILON, DriftMonitor, Reference, RouteDrift,
                              RouteSpec, psi)

LABELS = ("a", "b", "c", "d")
WARN = 0.25


def _classify_answers(rng: np.random.Generator, n: int, shares=(0.25, 0.25, 0.25, 0.25), confidence=0.95):
    indices = rng.choice(len(shares), size=n, p=shares)
    scores = np.clip(rng.normal(confidence, 0.03, size=n), 0.0, 1.0)
    return indices, scores


def test_psi_of_equal_distributions_is_zero_and_grows_with_the_shift():
    assert psi([10, 20, 30], [1, 2, 3]) == pytest.approx(0.0)  # counts are normalised
    assert psi([50, 50], [60, 40]) == pytest.approx(0.1 * np.log(1.2) + 0.1 * np.log(1.25), rel=1e-6)
    assert psi([50, 50], [60, 40]) < psi([50, 50], [80, 20]) < psi([50, 50], [95, 5])


def test_psi_gives_an_empty_bin_a_small_epsilon_not_infinity():
    value = psi([100, 0], [90, 10])
    expected = (0.9 - 1.0) * np.log(0.9 / 1.0) + (0.1 - PSI_EPSILON) * np.log(0.1 / PSI_EPSILON)
    assert np.isfinite(value) and value == pytest.approx(expected)
    assert psi([0, 0], [1, 2]) == 0.0  # nothing to compare with


def test_same_distribution_reads_near_zero_a_shifted_one_above_the_threshold():
    rng = np.random.default_rng(0)
    ref_idx, ref_scores = _classify_answers(rng, 500)
    reference = Reference.of("classify", ref_scores, ref_idx, len(LABELS))
    same = RouteDrift("classify", LABELS, DriftConfig(window=1000), reference)
    for i, s in zip(*_classify_answers(rng, 1000)):
        same.observe(int(i), float(s))
    assert max(same.measures().values()) < 0.1  # chance alone: about (k - 1)(1/n + 1/m)
    shifted = RouteDrift("classify", LABELS, DriftConfig(window=1000), reference)
    for i, s in zip(*_classify_answers(rng, 1000, shares=(0.7, 0.1, 0.1, 0.1), confidence=0.6)):
        shifted.observe(int(i), float(s))
    measures = shifted.measures()
    assert measures["labels"] > WARN and measures["score"] > WARN


def test_a_reference_counts_top1_indices_of_any_integer_dtype():
    # evaluate hands over int64 indices; on armv7 (32-bit, numpy 1.24) bincount refused them
    # ("Cannot cast array data from dtype('int64') to dtype('int32')") and the daemon died at start-up.
    for dtype in (np.int64, np.int32, np.intp, np.uint8):
        reference = Reference.of("classify", [0.9, 0.8, 0.7], np.array([0, 3, 3], dtype=dtype), len(LABELS))
        assert reference.label_counts == (1, 0, 0, 2)


def test_the_window_slides_the_oldest_answer_out():
    reference = Reference.of("classify", [0.95] * 4, [0, 1, 2, 3], len(LABELS))
    drift = RouteDrift("classify", LABELS, DriftConfig(window=4, min_answers=4), reference)
    for index in (0, 1, 2):
        drift.observe(index, 0.95)
    assert drift.measures() is None  # fewer than min_answers
    drift.observe(3, 0.95)
    assert drift.measures() == pytest.approx({"labels": 0.0, "score": 0.0})
    for _ in range(4):  # four answers of label a push the balanced ones out
        drift.observe(0, 0.35)
    assert drift.filled == 4 and drift.label_counts == {0: 4, 1: 0, 2: 0, 3: 0}
    assert drift.bin_counts[3] == 4 and sum(drift.bin_counts) == 4
    state = drift.state(drift.measures())
    assert state["label_shares"] == {"a": 1.0} and state["reference_label_shares"]["d"] == 0.25
    assert state["psi"]["labels"] > WARN


def test_without_validate_the_first_answers_are_the_reference():
    drift = RouteDrift("classify", LABELS, DriftConfig(window=10, reference_answers=8, min_answers=4))
    for i in range(8):
        drift.observe(i % 4, 0.9)
    assert drift.reference is not None and drift.reference.source == FROM_FIRST_ANSWERS
    assert drift.reference.label_counts == (2, 2, 2, 2) and drift.filled == 0  # the window starts after it
    state = drift.state(None)
    assert state["reference"] == {"source": FROM_FIRST_ANSWERS, "n": 8} and state["psi"] is None


def test_anomaly_scores_are_binned_at_the_reference_deciles_and_report_quantiles():
    rng = np.random.default_rng(1)
    reference = Reference.of("anomaly", rng.gamma(2.0, 0.01, size=1000), source=FROM_VALIDATE)
    assert len(reference.score_edges) == 9 and all(abs(c - 100) <= 1 for c in reference.score_counts)
    same = RouteDrift("anomaly", (), DriftConfig(window=500), reference)
    worse = RouteDrift("anomaly", (), DriftConfig(window=500), reference)
    for normal, shifted in zip(rng.gamma(2.0, 0.01, size=500), rng.gamma(2.0, 0.02, size=500)):
        same.observe(None, float(normal))
        worse.observe(None, float(shifted))
    assert same.measures()["score"] < 0.1 and "labels" not in same.measures()
    assert worse.measures()["score"] > WARN
    state = worse.state(worse.measures())
    assert state["score_quantiles"]["p50"] > state["reference_quantiles"]["p50"]


def _monitor(window=100, **kw) -> DriftMonitor:
    config = DriftConfig(window=window, min_answers=50, warn_above=WARN, **kw)
    monitor = DriftMonitor(config)
    specs = [RouteSpec("r", "classify", LABELS, ("r", 1)), RouteSpec("boxes", "detect", (), ("boxes", 1))]
    reference = Reference.of("classify", [0.95] * 400, [0, 1, 2, 3] * 100, len(LABELS))
    monitor.configure(config, specs, {"r": reference})
    return monitor


def test_a_warning_once_per_episode_and_a_line_when_it_is_back(caplog):
    monitor = _monitor()
    assert set(monitor.snapshot()) == {"r"}  # detect routes have no drift measure
    caplog.set_level(logging.INFO, logger="daemon.obs.drift")
    monitor.observe([("r", 0, 0.3)] * 100)
    for _ in range(3):
        state = monitor.snapshot()["r"]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "drift on route 'r'" in warnings[0].getMessage()
    assert "above drift.warn_above 0.25" in warnings[0].getMessage() and state["drifting"] is True
    monitor.observe([("r", i % 4, 0.95) for i in range(100)])
    monitor.snapshot()
    monitor.snapshot()
    back = [r for r in caplog.records if "back below" in r.getMessage()]
    assert len(back) == 1 and back[0].levelno == logging.INFO and not monitor.snapshot()["r"]["drifting"]
    monitor.observe([("r", 0, 0.3)] * 100)
    monitor.snapshot()
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 2  # a new episode


def test_a_reload_keeps_an_unchanged_routes_window_and_resets_a_changed_one():
    monitor = _monitor()
    monitor.observe([("r", 0, 0.95)] * 60)
    same = [RouteSpec("r", "classify", LABELS, ("r", 1))]
    assert monitor.stale(monitor.config, same) == []
    monitor.configure(monitor.config, same, {})
    assert monitor.snapshot()["r"]["answers"] == 60
    changed = [RouteSpec("r", "classify", LABELS, ("r", 2))]  # another model digest
    assert monitor.stale(monitor.config, changed) == changed
    monitor.configure(monitor.config, changed, {})
    assert monitor.snapshot()["r"]["answers"] == 0
    monitor.configure(DriftConfig(enabled=False), changed, {})
    assert monitor.snapshot() == {}


def test_an_unknown_route_or_an_index_past_the_labels_is_harmless():
    monitor = _monitor()
    monitor.observe([("nope", 1, 0.5), ("r", 9, 0.5)] + [("r", 0, 0.95)] * 60)
    state = monitor.snapshot()["r"]
    assert state["label_shares"]["9"] > 0 and state["psi"]["labels"] > 0


def test_prometheus_reads_each_routes_psi_at_the_scrape():
    from daemon.obs.prometheus import StatsCollector
    from daemon.obs.stats import Stats

    monitor = _monitor()
    monitor.observe([("r", 0, 0.3)] * 100)
    families = {f.name: f for f in StatsCollector(Stats(), dict, drift=monitor.snapshot).collect()}
    psi_samples = {s.labels["measure"]: s.value for s in families["edge_inferd_drift_psi"].samples}
    assert set(psi_samples) == {"labels", "score"} and psi_samples["labels"] > WARN
    assert families["edge_inferd_drift_window_answers"].samples[0].value == 100
    assert families["edge_inferd_drift_warning"].samples[0].value == 1
