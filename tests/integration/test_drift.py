"""Drift through the real daemon and a real mosquitto: the retained stats' PSI of a route rises once
its requests come from a shifted sensor, and the daemon warns once (daemon/obs/drift.py)."""

from __future__ import annotations

import json

import numpy as np

from tests.integration.conftest import ROOT, burst, write_config

STATS = "edge-inferd/edge-inferd/stats"
ACC_X_OFFSET_MS2 = 8.0  # a sensor bias on the accelerometer's x axis (benchmarks/drift_demo.py: accuracy 0.34)


def _payloads(offset: float, first_id: int) -> list[bytes]:
    with np.load(ROOT / "models/activity/test.npz") as data:
        x = data["x"].astype(np.float64)
    x[..., 0] += offset
    return [json.dumps({"id": first_id + i, "data": np.round(row, 3).tolist()}).encode() for i, row in enumerate(x)]


def test_the_retained_drift_of_a_route_rises_after_shifted_requests(tmp_path, client, start_daemon):
    # The reference is the route's validate data (models/activity/test.npz, 40 windows); a window of 40.
    config = write_config(tmp_path, stats_interval_s=0.2, drift={"window": 40, "min_answers": 40})
    daemon = start_daemon(config, wait_online=client)
    client.subscribe(STATS)
    client.subscribe("results/+/activity")
    first = client.wait_json(STATS)[0]
    assert first["drift"]["activity"]["reference"] == {"source": "validate", "n": 40}
    assert "load-profile" not in first["drift"]  # a values route: no drift measure
    burst(client, "sensors/clean/imu", _payloads(0.0, 0))
    clean = client.wait_json_until(STATS, lambda s: s["drift"]["activity"]["answers"] >= 40)["drift"]["activity"]
    assert clean["psi"]["labels"] < 0.1 and clean["psi"]["score"] < 0.1 and not clean["drifting"]
    burst(client, "sensors/shifted/imu", _payloads(ACC_X_OFFSET_MS2, 100))
    shifted = client.wait_json_until(STATS, lambda s: s["drift"]["activity"]["drifting"])["drift"]["activity"]
    assert shifted["psi_max"] > 0.25 and shifted["psi"]["labels"] > 0.25
    assert daemon.wait_for_log("drift on route 'activity'")
    client.wait_count(STATS, len(client.on(STATS)) + 3)  # more stats read: still one warning for the episode
    assert daemon.log().count("drift on route 'activity': PSI") == 1
