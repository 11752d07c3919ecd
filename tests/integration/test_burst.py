"""Bursts as users send them: `mosquitto_pub -l` pushes a whole file at QoS 1, unpaced.

A gateway replaying its buffer after a reconnect sends exactly this. Admission is by
bytes and predicted wait, not by message count, so a burst that fits is served in full.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections import Counter

import numpy as np
import pytest

from tests.integration.conftest import ROOT, WAIT_S, write_config

BURST = 5000
# Sensor-like precision: 3 decimals, as a device would print its readings.
DECIMALS = 3


def _burst_file(tmp_path, n: int):
    with np.load(ROOT / "models/activity/test.npz") as data:
        x, y = data["x"], data["y"]
    path = tmp_path / "burst.txt"
    with open(path, "w") as fh:
        for i in range(n):
            rows = np.round(x[i % len(x)], DECIMALS).tolist()  # nested [[6 floats] x 100], as users send
            fh.write(json.dumps({"id": i, "data": rows}, separators=(",", ":")) + "\n")
    return path, y


@pytest.mark.skipif(shutil.which("mosquitto_pub") is None, reason="mosquitto_pub missing: apt-get install "
                    "mosquitto-clients (./scripts/setup.sh does this)")
def test_a_5000_request_burst_is_served_in_full(tmp_path, broker, client, start_daemon, transport):
    config = write_config(tmp_path, transport=transport, cache={"enabled": False})  # every request runs the model
    start_daemon(config, wait_online=client)
    client.subscribe("results/burst/activity")
    path, labels = _burst_file(tmp_path, BURST)
    with open(path, "rb") as fh:
        subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(broker.port), "-q", "1", "-l",
                        "-t", "sensors/burst/imu"], stdin=fh, check=True, timeout=WAIT_S)
    replies = client.wait_json("results/burst/activity", BURST)
    assert len(replies) == BURST
    codes = Counter(r.get("error", {}).get("code", "result") for r in replies)
    assert codes == {"result": BURST}, codes  # no `overloaded`: the burst fits the byte budget
    assert sorted(r["id"] for r in replies) == list(range(BURST))  # each answered exactly once
    names = (ROOT / "models/activity/labels.txt").read_text().split()
    accuracy = np.mean([names[labels[r["id"] % len(labels)]] == r["label"] for r in replies])
    assert accuracy == 1.0  # activity is 40/40 on its test split, batched or not
