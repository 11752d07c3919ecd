"""Home Assistant discovery payloads: topics, ids, templates by output kind, and HA's own schemas."""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from daemon.config.loader import load_config
from daemon.obs import ha_discovery
from tests.homeassistant import ha

ROOT = Path(__file__).resolve().parents[2]
CONFIG = load_config(ROOT / "config.yaml", check_models=False)
MQTT = replace(CONFIG.mqtt, client_id="gw.1")
ROUTES = {route.name: route for route in CONFIG.routes}


def _payloads() -> list[tuple[str, dict]]:
    out = ha_discovery.node_configs(MQTT, "homeassistant", "0.1.0")
    for route in CONFIG.routes:
        found = ha_discovery.entity_config(MQTT, "homeassistant", "0.1.0", route, "dev 7", f"results/x/{route.name}")
        if found is not None:
            out.append(found)
    return out


def test_ids_are_what_home_assistant_accepts_and_stay_apart():
    assert ha_discovery.object_id("dev7") == "dev7"
    assert ha_discovery.object_id("a.b").startswith("a_b_") and ha_discovery.object_id("a.b") != "a_b"
    assert ha_discovery.object_id("a.b") != ha_discovery.object_id("a/b")
    for topic, payload in _payloads():
        prefix, component, node, object_name, tail = topic.split("/")
        assert (prefix, node, tail) == ("homeassistant", ha_discovery.node_id(MQTT), "config")
        assert component in (ha_discovery.SENSOR, ha_discovery.BINARY_SENSOR)
        assert ha_discovery.object_id(object_name) == object_name
        assert payload["availability_topic"] == "edge-inferd/gw.1/status"


def test_the_node_reads_its_stats_and_each_kind_its_own_result():
    node = dict(_payloads()[:len(ha_discovery.NODE_SENSORS)])
    assert {p["state_topic"] for p in node.values()} == {"edge-inferd/gw.1/stats"}
    by_route = {p["name"]: (t.split("/")[1], p) for t, p in _payloads()[len(ha_discovery.NODE_SENSORS):]}
    assert "load-profile" not in by_route  # values: no one state to show
    component, activity = by_route["activity"]
    assert component == "sensor" and "value_json.label" in activity["value_template"]
    assert activity["state_topic"] == activity["json_attributes_topic"] == "results/x/activity"
    assert activity["device"]["name"] == "dev 7"
    assert activity["device"]["via_device"] == f"edge_inferd_{ha_discovery.node_id(MQTT)}"
    component, load = by_route["load"]
    assert component == "binary_sensor" and "value_json.anomaly" in load["value_template"]
    detect = replace(ROUTES["activity"], kind="detect")
    _, payload = ha_discovery.entity_config(MQTT, "homeassistant", "0.1.0", detect, "cam", "results/cam")
    assert "value_json.detections | count" in payload["value_template"]
    no_threshold = replace(ROUTES["load"], threshold=None)
    topic, payload = ha_discovery.entity_config(MQTT, "homeassistant", "0.1.0", no_threshold, "d", "r/d")
    assert topic.split("/")[1] == "sensor" and "anomaly_score" in payload["value_template"]


@pytest.mark.skipif(ha.available() is not None, reason=ha.available() or "")
def test_every_payload_passes_home_assistants_own_discovery_schema():
    """homeassistant.components.mqtt.<component>.DISCOVERY_SCHEMA, run by HA's Python (it is not ours)."""
    payloads = [[topic.split("/")[1], payload] for topic, payload in _payloads()]
    payloads.append(["sensor", ha_discovery.entity_config(MQTT, "homeassistant", "0.1.0",
                                                          replace(ROUTES["activity"], kind="detect"), "c", "r/c")[1]])
    done = subprocess.run([str(ha.HA_PYTHON), str(ROOT / "tests" / "homeassistant" / "schema_check.py")],
                          input=json.dumps(payloads), capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(done.stdout) == [""] * len(payloads)
