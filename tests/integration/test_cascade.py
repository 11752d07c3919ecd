"""The confidence cascade over a real mosquitto: two daemons as tiers (`escalate.to_topic`).

The near daemon escalates every request (score_below above 1) to `gpu/{1}/imu`, where the far
daemon serves the same route; the far one is killed mid-stream. Every request must still be
answered exactly once, the ones the far tier can no longer answer within timeout_ms + 100 ms.
"""

from __future__ import annotations

import json
import signal
import time

import numpy as np
import yaml

from tests.integration.conftest import ROOT, Client, TimedClient, write_config

TIMEOUT_MS = 300
SLACK_S = 0.1
N = 60
KILL_AT = 20
GAP_S = 0.02  # between requests: a stream, not a burst


def _route(subscribe: str, **extra) -> dict:
    raw = yaml.safe_load((ROOT / "config.yaml").read_text())
    route = raw["routes"][0]  # activity
    route.pop("validate", None)
    return {**route, "subscribe": subscribe, **extra}


def _config(tmp_path, name: str, route: dict):
    folder = tmp_path / name
    folder.mkdir()
    return write_config(folder, mqtt={"client_id": name, "session_expiry_s": 0}, routes=[route],
                        cache={"enabled": False}, workers={"max": 1})


def test_far_tier_killed_mid_stream_every_request_answered_once_in_time(tmp_path, broker, start_daemon):
    client = TimedClient(broker)
    try:
        far = start_daemon(_config(tmp_path, "far", _route("gpu/+/imu")), wait_online=client, client_id="far")
        near_route = _route("sensors/+/imu", escalate={"when": {"score_below": 1.01}, "to_topic": "gpu/{1}/imu",
                                                       "timeout_ms": TIMEOUT_MS, "max_rate_per_s": 1000})
        start_daemon(_config(tmp_path, "near", near_route), wait_online=client, client_id="near")
        client.subscribe("results/+/activity")
        with np.load(ROOT / "models/activity/test.npz") as data:
            x = data["x"]
        sent, killed_at = {}, None
        for i in range(N):
            if i == KILL_AT:  # mid-stream: some requests are at the far tier right now
                far.proc.send_signal(signal.SIGKILL)
                killed_at = time.monotonic()
            sent[i] = time.monotonic()
            client.publish("sensors/w1/imu", json.dumps({"id": i, "data": x[i % len(x)].tolist()}).encode())
            time.sleep(GAP_S)
        client.wait_count("results/w1/activity", N)
        time.sleep(TIMEOUT_MS / 1000 + 0.5)  # room for a duplicate to show up
        replies = [json.loads(m.payload) for m in client.on("results/w1/activity")]
    finally:
        client.close()
    assert sorted(r["id"] for r in replies) == list(range(N))  # each exactly once
    by_id = {r["id"]: r for r in replies}
    before = [by_id[i]["tier"] for i in range(KILL_AT)]
    assert before.count("remote") >= KILL_AT // 2, before  # the far tier answered while it was there
    assert all(r["tier"] == "local" and r["escalation"] == "timeout"
               for r in replies if r["tier"] != "remote")
    assert all(by_id[i]["tier"] == "local" for i in range(KILL_AT, N))
    # No reply waits past the request's own deadline, nor past timeout_ms after the far tier went.
    late = {i: client.arrived[i][0] - max(sent[i], killed_at) for i in range(N)}
    too_late = {i: (round(s, 3), by_id[i]["tier"], by_id[i].get("escalation"))
                for i, s in late.items() if s > TIMEOUT_MS / 1000 + SLACK_S}
    assert not too_late, f"replies later than timeout_ms + {SLACK_S} s (id: s, tier, escalation): {too_late}"


SILENT_N = 5


def test_a_far_tier_that_never_answers_costs_timeout_ms_and_the_reply_and_stats_say_so(tmp_path, broker,
                                                                                      start_daemon):
    """The far tier gets every escalation (this client takes them) and never answers: each
    request gets its local answer `timeout_ms` after arrival, and its `latency_ms` says so, no
    less than timeout_ms and no more than the client saw from publish to reply; the stats'
    latency (the daemon's last stats, at stop) carries the same wait."""
    client = TimedClient(broker)
    try:
        near_route = _route("sensors/+/imu", escalate={"when": {"score_below": 1.01}, "to_topic": "gpu/{1}/imu",
                                                       "timeout_ms": TIMEOUT_MS, "max_rate_per_s": 1000})
        near = start_daemon(_config(tmp_path, "near", near_route), wait_online=client, client_id="near")
        client.subscribe("results/+/activity")
        client.subscribe("gpu/+/imu")  # the far tier: it takes each request and stays silent
        with np.load(ROOT / "models/activity/test.npz") as data:
            x = data["x"]
        sent = {}
        for i in range(SILENT_N):
            sent[i] = time.monotonic()
            client.publish("sensors/w1/imu", json.dumps({"id": i, "data": x[i].tolist()}).encode())
        replies = {r["id"]: r for r in client.wait_json("results/w1/activity", SILENT_N)}
        assert client.count("gpu/w1/imu") == SILENT_N  # every one was escalated, none answered
        assert near.stop() == 0
    finally:
        client.close()
    for i, r in replies.items():
        seen_ms = (client.arrived[i][0] - sent[i]) * 1000
        assert r["tier"] == "local" and r["escalation"] == "timeout", r
        assert TIMEOUT_MS <= r["latency_ms"] <= seen_ms, (r, seen_ms)
    stats = near.final_stats()
    assert stats["counts"]["escalation_timeout"] == SILENT_N
    assert stats["latency_ms"]["n"] == SILENT_N and stats["latency_ms"]["p50"] >= TIMEOUT_MS, stats["latency_ms"]


def test_bundled_appliance_cascade_answers_the_unsure_with_the_large_model(tmp_path, broker, start_daemon):
    """config.yaml's appliance route with its commented cascade switched on: `appliance_large`
    reads the full-resolution trace (`escalate.preprocess`, from its card). The unsure requests
    are answered by it, exactly as the large model alone answers them; the others locally."""
    card = json.loads((ROOT / "models/appliance_large/card.json").read_text())
    raw = yaml.safe_load((ROOT / "config.yaml").read_text())
    route = next(r for r in raw["routes"] if r["name"] == "appliance")
    route.pop("validate", None)
    threshold = 0.65
    route["escalate"] = {"when": {"score_below": threshold}, "to_model": "appliance_large",
                         "preprocess": card["preprocessing"], "max_rate_per_s": 1000}
    models = {name: {"path": str(ROOT / f"models/{name}/model.tflite"),
                     "labels": str(ROOT / f"models/{name}/labels.txt")} for name in ("appliance", "appliance_large")}
    config = write_config(tmp_path, routes=[route], models=models, cache={"enabled": False})
    with np.load(ROOT / "models/appliance/test.npz") as data:
        x = data["x"][:20]
    client = Client(broker)
    try:
        start_daemon(config, wait_online=client)
        client.subscribe("results/+/appliance")
        for i, row in enumerate(x):
            client.publish("plugs/p1/power", json.dumps({"id": i, "data": row.tolist()}).encode())
        replies = {r["id"]: r for r in client.wait_json("results/p1/appliance", 20)}
    finally:
        client.close()
    from daemon.model import preprocess
    from daemon.model.runtime import Model

    steps = [preprocess.parse_step(s) for s in card["preprocessing"]]
    large = Model(ROOT / "models/appliance_large/model.tflite").infer(preprocess.apply_steps(steps, x))
    tiers = [replies[i]["tier"] for i in range(len(x))]
    assert "local" in tiers and "local-large" in tiers, tiers
    for i, r in replies.items():
        if r["tier"] == "local-large":
            assert r["model"] == "appliance_large" and r["index"] == int(large[i].argmax())
        else:
            assert r["model"] == "appliance" and r["score"] >= threshold
