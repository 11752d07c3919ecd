"""Scale to zero end to end: a real daemon and mosquitto, `workers.idle_unload_s` short.

The test waits on the retained stats (published every 0.1 s) for `loaded` to turn false,
sends the same request again and gets the same scores from a model loaded on demand."""

from __future__ import annotations

import json

import numpy as np

from tests.integration.conftest import ROOT, Client, write_config

STATS = "edge-inferd/edge-inferd/stats"
REPLIES = "results/w1/activity"


def _request(client: Client, i: int) -> dict:
    with np.load(ROOT / "models/activity/test.npz") as data:
        sample = data["x"][0]
    client.publish("sensors/w1/imu", json.dumps({"id": i, "data": sample.tolist()}).encode())
    return client.wait_json_until(REPLIES, lambda reply: reply["id"] == i)


def test_an_idle_model_is_unloaded_and_the_next_request_loads_it_with_the_same_scores(tmp_path, client,
                                                                                      start_daemon):
    config = write_config(tmp_path, cache={"enabled": False}, stats_interval_s=0.1,
                          workers={"max": 2, "idle_unload_s": 0.5})
    client.subscribe(REPLIES)
    client.subscribe(STATS)
    start_daemon(config, wait_online=client)

    before = _request(client, 0)
    unloaded = client.wait_json_until(STATS, lambda s: not s["models"]["activity"]["loaded"])
    assert unloaded["models"]["activity"]["cold_starts"] == 0
    with client.cond:
        del client.messages[:]  # from here on, only stats published after the unload
    after = _request(client, 1)

    assert "error" not in after and not after["cached"]
    assert (after["label"], after["score"], after["top_k"]) == (before["label"], before["score"], before["top_k"])
    reloaded = client.wait_json_until(STATS, lambda s: s["models"]["activity"]["loaded"]
                                      and s["models"]["activity"]["cold_starts"] >= 1)
    assert reloaded["models"]["activity"]["cold_start_ms"] > 0
    assert reloaded["results"] >= 2
