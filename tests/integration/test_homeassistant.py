"""Home Assistant discovery against a real Home Assistant (2024.3.3, scripts/setup_ha.sh).

A private mosquitto, the real daemon with `homeassistant.discovery: true`, and HA with its MQTT
integration on that broker (tests/homeassistant/ha.py). Through HA's REST API (`/api/states`):
the node's sensors and each device's entities appear, take the daemon's answers as their state
(the label and its score and top_k as attributes; the anomaly flag as a binary sensor), an idle
device's entity is removed, and everything goes `unavailable` when the daemon stops.
Skipped, saying why, where HA's venv is absent.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from tests.homeassistant import ha
from tests.integration.conftest import ROOT, activity_payloads, write_config

pytestmark = pytest.mark.skipif(ha.available() is not None, reason=ha.available() or "")

IDLE_S = 4.0
SEND_EVERY_S = 0.5
WAIT_S = 60.0
UNAVAILABLE = "unavailable"


def _load_payload(i: int) -> bytes:
    with np.load(ROOT / "models/load_anomaly/test.npz") as data:
        x = data["x"]
    return json.dumps({"id": i, "data": np.round(x[i % len(x)], 3).tolist()}).encode()


def _entity(states: dict, suffix: str) -> dict:
    found = [state for entity_id, state in states.items() if entity_id.endswith(suffix)]
    return found[0] if found else {}


def _until(home: ha.HomeAssistant, what: str, predicate, send=None) -> dict:
    """Poll HA's states until `predicate` holds, calling `send()` every SEND_EVERY_S meanwhile."""
    deadline, last_sent = time.monotonic() + WAIT_S, 0.0
    while True:
        if send is not None and time.monotonic() - last_sent >= SEND_EVERY_S:
            send()
            last_sent = time.monotonic()
        states = home.states()
        if predicate(states):
            return states
        if time.monotonic() > deadline:
            shown = {k: (v["state"], v["attributes"]) for k, v in states.items() if "edge_inferd" in k}
            raise AssertionError(f"{what}: not seen in {WAIT_S:.0f} s; HA states {shown}\n{home.log()[-3000:]}")
        time.sleep(ha.POLL_S)


def test_entities_appear_follow_the_answers_and_go_unavailable(tmp_path, broker, client, start_daemon,
                                                             home_assistant):
    config = write_config(tmp_path, stats_interval_s=0.5,
                          homeassistant={"discovery": True, "device_idle_s": IDLE_S, "max_devices": 8})
    client.subscribe("results/#")
    daemon = start_daemon(config, wait_online=client)
    activity, sent = activity_payloads(8), {"n": 0}

    def send_both() -> None:
        i = sent["n"] = sent["n"] + 1
        client.publish("sensors/dev7/imu", activity[i % len(activity)])
        client.publish("grid/g1/load", _load_payload(i))

    def answered(topic: str) -> dict:
        replies = [json.loads(m.payload) for m in client.messages if m.topic == topic]
        return replies[-1] if replies else {}

    def matches(states: dict) -> bool:
        label, anomaly = answered("results/dev7/activity"), answered("results/g1/load")
        sensor, flag = _entity(states, "_activity_dev7"), _entity(states, "_load_g1")
        return bool(label and anomaly and sensor and flag) and sensor["state"] == label["label"] and \
            sensor["attributes"].get("top_k") == label["top_k"] and \
            flag["state"] == ("on" if anomaly["anomaly"] else "off")

    # The first answers may come before HA has subscribed to the topics its discovery just named:
    # keep sending until the entities show the latest answers (each reply is a new state to show).
    states = _until(home_assistant, "the entities with the daemon's answers", matches, send_both)
    sensor = _entity(states, "_activity_dev7")
    assert sensor["attributes"]["friendly_name"] == "dev7 activity"
    assert abs(sensor["attributes"]["score"] - answered("results/dev7/activity")["score"]) < 1e-6
    assert _entity(states, "_load_g1")["attributes"]["device_class"] == "problem"

    # An error reply on the same topic carries no result: the entity keeps its state and attributes.
    before = {"state": sensor["state"], "top_k": sensor["attributes"]["top_k"]}
    client.publish("sensors/dev7/imu", json.dumps({"id": "bad", "data": [1.0, 2.0]}).encode())
    client.wait_json_until("results/dev7/activity", lambda reply: reply.get("id") == "bad")
    time.sleep(1.0)  # HA has had the error reply (the same broker, the same topic, a few ms)
    after = _entity(home_assistant.states(), "_activity_dev7")
    assert {"state": after["state"], "top_k": after["attributes"]["top_k"]} == before

    node = _until(home_assistant, "the node's sensors from the stats",
                  lambda s: _entity(s, "_models_loaded").get("state") == "4"
                  and _entity(s, "_devices").get("state") == "2"
                  and _entity(s, "_errors").get("state") == "1",  # the bad_shape answer above
                  send_both)
    assert float(_entity(node, "_requests_per_s")["state"]) >= 0
    assert float(_entity(node, "_latency_p99")["state"]) > 0

    # dev7 stops; g1 goes on: only dev7's entity is removed once idle past device_idle_s.
    _until(home_assistant, "dev7's entity removed once idle",
           lambda s: not _entity(s, "_activity_dev7") and _entity(s, "_load_g1"),
           lambda: client.publish("grid/g1/load", _load_payload(0)))

    daemon.stop()  # the daemon's `offline` on its retained status topic: HA's availability
    states = _until(home_assistant, "unavailable once the daemon stopped",
                    lambda s: _entity(s, "_load_g1").get("state") == UNAVAILABLE
                    and _entity(s, "_models_loaded").get("state") == UNAVAILABLE)
    assert daemon.final_stats()["homeassistant"]["removed"] >= 1
    problems = [line for line in home_assistant.log().splitlines()
                if ("ERROR" in line or "WARNING" in line) and "mqtt" in line]
    assert problems == [], problems  # no template or JSON complaints from HA's MQTT integration
