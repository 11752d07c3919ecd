"""Hot reload (SIGHUP) against a real mosquitto and the real daemon.

A bad model never replaces a good one (it is checked in a child process first); changed
labels are swapped in without a restart; a changed route restarts the affected steps
without losing the requests that arrive meanwhile.
"""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import numpy as np
import yaml

from tests.integration.conftest import ROOT, WAIT_S, Client, write_config


def _activity_copy(tmp_path: Path) -> tuple[Path, Path]:
    """The activity model and labels copied where the test may overwrite them."""
    folder = tmp_path / "models"
    folder.mkdir()
    model, labels = folder / "model.tflite", folder / "labels.txt"
    shutil.copy(ROOT / "models/activity/model.tflite", model)
    shutil.copy(ROOT / "models/activity/labels.txt", labels)
    return model, labels


def _config(tmp_path: Path, model: Path, labels: Path, **overrides) -> Path:
    models = {"activity": {"path": str(model), "labels": str(labels)},
              "appliance": {"path": str(ROOT / "models/appliance/model.tflite"),
                            "labels": str(ROOT / "models/appliance/labels.txt")}}
    return write_config(tmp_path, cache={"enabled": False}, models=models, **overrides)


def _requests(n: int, start: int = 0) -> list[bytes]:
    with np.load(ROOT / "models/activity/test.npz") as data:
        x = data["x"]
    return [json.dumps({"id": i, "data": x[i % len(x)].tolist()}).encode() for i in range(start, start + n)]


def _stats(client: Client, node: str = "edge-inferd") -> dict:
    return json.loads(client.on(f"edge-inferd/{node}/stats")[-1].payload)


def test_a_bad_model_on_sighup_leaves_the_old_one_serving(tmp_path, broker, client, start_daemon):
    """Each damage in turn on one daemon (truncated, garbage, another model's shape): each SIGHUP
    fails its check, and the good model answers after each."""
    model, labels = _activity_copy(tmp_path)
    daemon = start_daemon(_config(tmp_path, model, labels), wait_online=client)
    client.subscribe("results/r1/activity")
    client.publish("sensors/r1/imu", _requests(1)[0])
    [before] = client.wait_json("results/r1/activity")
    good = model.read_bytes()
    damages = {"truncated": good[: len(good) // 3], "garbage": bytes(range(256)) * 40,
               "wrong_shape": (ROOT / "models/appliance/model.tflite").read_bytes()}
    for failures, (damage, bad) in enumerate(damages.items(), start=1):
        model.write_bytes(bad)
        daemon.proc.send_signal(signal.SIGHUP)
        assert daemon.wait_for_log("reload failed; still serving", count=failures), (damage, daemon.log()[-3000:])
        client.publish("sensors/r1/imu", _requests(1)[0])
        replies = client.wait_json("results/r1/activity", failures + 1)
        assert replies[failures]["label"] == before["label"] and daemon.proc.poll() is None, damage
    assert daemon.log().count("Traceback") == 0
    assert daemon.stop() == 0
    final = daemon.final_stats()
    assert final["counts"]["reload_failures"] == len(damages)


def test_changed_labels_are_swapped_in_without_losing_a_request(tmp_path, broker, client, start_daemon):
    model, labels = _activity_copy(tmp_path)
    daemon = start_daemon(_config(tmp_path, model, labels), wait_online=client)
    client.subscribe("results/r2/activity")
    sent = _requests(300)
    for payload in sent[:150]:
        client.c.publish("sensors/r2/imu", payload, qos=1)
    renamed = [f"v2-{line}" for line in labels.read_text().split()]
    labels.write_text("\n".join(renamed) + "\n")
    daemon.proc.send_signal(signal.SIGHUP)
    for payload in sent[150:]:
        client.c.publish("sensors/r2/imu", payload, qos=1)
    assert daemon.wait_for_log("reload: applied (models swapped: activity)"), daemon.log()[-3000:]
    client.publish("sensors/r2/imu", _requests(1, start=300)[0])
    replies = client.wait_json("results/r2/activity", 301)
    assert {r["id"] for r in replies} == set(range(301))
    by_id = {r["id"]: r for r in replies}
    assert by_id[300]["label"] in renamed  # sent after the swap: the new labels
    assert all(r["label"] in renamed or f"v2-{r['label']}" in renamed for r in replies)


def test_a_changed_route_restarts_its_steps_and_keeps_every_request(tmp_path, broker, start_daemon):
    model, labels = _activity_copy(tmp_path)
    config = _config(tmp_path, model, labels)
    collector = Client(broker, client_id="collector-r3", persistent=True)
    daemon = start_daemon(config, wait_online=collector)
    collector.subscribe("results/r3/#")
    raw = yaml.safe_load(config.read_text())
    raw["routes"][0]["publish"] = "results/{1}/activity-v2"
    sent = _requests(200)
    for payload in sent[:100]:
        collector.c.publish("sensors/r3/imu", payload, qos=1)
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    daemon.proc.send_signal(signal.SIGHUP)
    for payload in sent[100:]:
        collector.c.publish("sensors/r3/imu", payload, qos=1)
    assert daemon.wait_for_log("reload: applied (restarted from serving)"), daemon.log()[-3000:]
    collector.publish("sensors/r3/imu", _requests(1, start=200)[0])
    with collector.cond:
        assert collector.cond.wait_for(lambda: len({json.loads(m.payload)["id"] for m in collector.messages
                                                    if m.topic.startswith("results/r3/")}) >= 201, WAIT_S)
    replies = [json.loads(m.payload) for m in collector.messages if m.topic.startswith("results/r3/")]
    assert {r["id"] for r in replies} == set(range(201))
    assert json.loads(collector.on("results/r3/activity-v2")[-1].payload)["id"] == 200
    collector.close()


def test_a_model_swapped_with_the_cache_on_never_serves_the_old_models_cached_answer(
        tmp_path, broker, client, start_daemon):
    """The cache key holds the model's digest: after a hot swap the same input is a miss, answered
    by the new model, and then the new model's hit. (A key that forgot the model would answer it
    from the old model's entry, `cached: true`, with the new model's digest on it.)"""
    model, labels = _activity_copy(tmp_path)
    config = write_config(tmp_path, cache={"enabled": True, "dir": str(tmp_path / "cache")}, stats_interval_s=0.1,
                          models={"activity": {"path": str(model), "labels": str(labels)},
                                  "appliance": {"path": str(ROOT / "models/appliance/model.tflite"),
                                                "labels": str(ROOT / "models/appliance/labels.txt")}})
    daemon = start_daemon(config, wait_online=client)
    client.subscribe("results/r4/activity")
    client.subscribe("edge-inferd/edge-inferd/stats")
    request = _requests(1)[0]

    def send(n: int, offered: int) -> None:
        """Request n, then wait until the cache has taken its result (offered after the reply)."""
        client.publish("sensors/r4/imu", request)
        client.wait_count("results/r4/activity", n)
        client.wait_json_until("edge-inferd/edge-inferd/stats",
                               lambda s: s["cache"]["refused"] + s["cache"]["admitted"] >= offered)

    for n in (1, 2):  # admission: the first sighting is remembered, the second stored, the third a hit
        send(n, offered=n)
    client.publish("sensors/r4/imu", request)
    client.wait_count("results/r4/activity", 3)
    old = [json.loads(m.payload) for m in client.on("results/r4/activity")]
    assert [r["cached"] for r in old] == [False, False, True]
    # The same graph with 16 bytes appended: the same int8 input tensor and answers, another digest.
    model.write_bytes(model.read_bytes() + b"\0" * 16)
    daemon.proc.send_signal(signal.SIGHUP)
    assert daemon.wait_for_log("reload: applied (models swapped: activity)"), daemon.log()[-3000:]
    for n in (4, 5):
        send(n, offered=n - 1)  # the hit (request 3) offered nothing
    client.publish("sensors/r4/imu", request)
    client.wait_count("results/r4/activity", 6)
    new = [json.loads(m.payload) for m in client.on("results/r4/activity")][3:]
    assert [r["cached"] for r in new] == [False, False, True]
    assert {r["model_sha256"] for r in new} != {old[0]["model_sha256"]}
    assert new[0]["label"] == old[0]["label"]
