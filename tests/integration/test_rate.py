"""`coalesce: latest` over a real mosquitto: a burst from one device gets one reply per request.

The daemon's workers decide how many are superseded (it depends on how fast they run), so
the test checks what holds whatever the timing: every request is answered exactly once,
each reply is a result or `superseded`, and the last request, never superseded, is a result.
"""

from __future__ import annotations

from collections import Counter

import yaml

from tests.integration.conftest import ROOT, activity_payloads, write_config

BURST = 300


def test_a_coalesced_burst_from_one_device_is_answered_once_each_and_ends_with_a_result(
        tmp_path, client, start_daemon):
    route = yaml.safe_load((ROOT / "config.yaml").read_text())["routes"][0]
    route.pop("validate", None)  # its relative data path is not needed here
    config = write_config(tmp_path, cache={"enabled": False}, routes=[{**route, "coalesce": "latest"}])
    start_daemon(config, wait_online=client)
    client.subscribe("results/burst/activity")
    for payload in activity_payloads(BURST):
        client.publish("sensors/burst/imu", payload)
    replies = client.wait_json("results/burst/activity", BURST)
    assert sorted(r["id"] for r in replies) == list(range(BURST))  # exactly one reply each
    codes = Counter(r.get("error", {}).get("code", "result") for r in replies)
    assert set(codes) <= {"result", "superseded"}, codes
    last = next(r for r in replies if r["id"] == BURST - 1)
    assert "error" not in last and last["label"], last
