"""Home Assistant's `update` entity for fleet delivery (daemon/fleet/node/ha_update.py).

The payloads: topics and ids, the state by reported state, and both checked by Home Assistant's
own code (the discovery schema of `mqtt.update`, and the JSON state keys its handler reads). Then a
real Home Assistant 2024.3.3 on a real mosquitto: the discovery config and states published as the
node publishes them, read back through HA's REST API, and `update.install` called there, whose
payload must reach the node's command topic. The HA tests are skipped, saying why, without HA's venv.
"""

from __future__ import annotations

import json
import subprocess
import urllib.error
from dataclasses import replace
from pathlib import Path

import pytest

from daemon.config.loader import load_config
from daemon.fleet.node import ha_update
from daemon.obs import ha_discovery
from daemon.tools.broker import Broker
from tests.homeassistant import ha
from tests.integration.conftest import Client

ROOT = Path(__file__).resolve().parents[3]
MQTT = replace(load_config(ROOT / "config.yaml", check_models=False).mqtt, client_id="gw.1")
NODE = ha_discovery.node_id(MQTT)
PREFIX = "homeassistant"
LATEST = {"version": "1.3.0", "summary": "Retrained on March's data: fewer false 'walking' at the packing line."}
URL = "http://releases.local/activity/4/"
needs_ha = pytest.mark.skipif(ha.available() is not None, reason=ha.available() or "")


def _entry(state: str, version="1.2.0", **more) -> dict:
    """A model's entry of the reported document (docs/fleet.md, "Reported")."""
    return {"state": state, "version": version, "serial": 3 if version else None, "sha256": "0123456789ab",
            "previous": None, "target": {"version": "1.3.0", "serial": 4, "url": URL}, "rejected": [], **more}


def test_the_entity_joins_the_node_device_and_installs_by_command():
    topic, payload = ha_update.discovery(NODE, "activity", PREFIX, MQTT)
    assert topic == f"homeassistant/update/{NODE}/fleet_activity/config" == ha_update.removal(NODE, "activity", PREFIX)
    assert payload["unique_id"] == payload["object_id"] == f"edge_inferd_{NODE}_fleet_activity"
    assert payload["device"]["identifiers"] == ha_discovery.node_device(MQTT, "x")["identifiers"]
    assert payload["availability_topic"] == "edge-inferd/gw.1/status"
    assert payload["state_topic"] == ha_update.state_topic(MQTT, "activity") == "edge-inferd/gw.1/fleet/ha/activity"
    assert payload["command_topic"] == "edge-inferd/gw.1/fleet/cmd" and payload["retain"] is False
    assert json.loads(payload["payload_install"]) == {"cmd": "install", "model": "activity"}
    assert payload["entity_category"] == "config" and "device_class" not in payload
    # A model name that is not one topic level still makes one level, and two such names stay apart.
    assert ha_update.state_topic(MQTT, "a/b").split("/")[-1] == ha_discovery.object_id("a/b")
    assert ha_update.removal(NODE, "a/b", PREFIX) != ha_update.removal(NODE, "a_b", PREFIX)
    with pytest.raises(ValueError):
        ha_update.discovery("gw2", "activity", PREFIX, MQTT)


def test_a_staged_release_is_an_update_with_its_summary():
    got = ha_update.state(_entry("staged", staged=4), LATEST)
    assert got["installed_version"] == "1.2.0" and got["latest_version"] == "1.3.0"
    assert got["release_summary"] == f"1.3.0 passed the gate: Install activates it. {LATEST['summary']}"
    assert got["release_url"] == "http://releases.local/activity/4/manifest.json"


def test_what_the_node_is_doing_goes_before_the_summary():
    got = ha_update.state(_entry("downloading", progress={"bytes": 5352, "total": 21408}), LATEST)
    assert got["release_summary"].startswith("Downloading 1.3.0 (25%).") and got["latest_version"] == "1.3.0"
    canary = ha_update.state(_entry("canary", version="1.3.0"), LATEST)
    assert canary["installed_version"] == canary["latest_version"] == "1.3.0"
    assert canary["release_summary"].startswith("Canary: watching 1.3.0")
    active = ha_update.state(_entry("active", version="1.3.0"), LATEST)
    assert active["release_summary"] == LATEST["summary"]


def test_a_refused_release_is_no_update_and_the_summary_says_why():
    error = {"code": "gate", "message": "accuracy 0.51 < current 0.975 - 0.02"}
    got = ha_update.state(_entry("failed", error=error), LATEST)
    assert got["latest_version"] == got["installed_version"] == "1.2.0"
    assert got["release_summary"] == "1.3.0 refused (gate): accuracy 0.51 < current 0.975 - 0.02"
    back = ha_update.state(_entry("rolled_back", error={"code": "canary", "message": "psi 0.4"}), LATEST)
    assert back["latest_version"] == "1.2.0" and back["release_summary"].startswith("Rolled back from 1.3.0")


def test_versions_are_strings_before_the_first_release_and_without_a_target():
    first = ha_update.state(_entry("staged", version=None, staged=4), LATEST)
    assert first["installed_version"] == "sha256:0123456789ab" and first["latest_version"] == "1.3.0"
    idle = ha_update.state({"state": "idle", "version": "1.2.0", "target": None}, None)
    assert idle == {"installed_version": "1.2.0", "latest_version": "1.2.0", "release_summary": ""}


def test_the_summary_fits_home_assistants_limit():
    got = ha_update.state(_entry("staged"), {"version": "1.3.0", "summary": "x" * 1000})
    assert len(got["release_summary"]) == ha_update.SUMMARY_MAX and got["release_summary"].endswith("…")


# HA's own code, run by its Python: the update discovery schema, and the JSON state keys that its
# state handler reads (the TypedDict beside it); HA from 2024.11 drops a state with any other key.
_STATE_KEYS = ("from homeassistant.components.mqtt.update import _MqttUpdatePayloadType as T; "
               "import json; print(json.dumps(sorted(T.__annotations__)))")


@needs_ha
def test_payloads_pass_home_assistants_own_schema_and_state_keys():
    payloads = [["update", ha_update.discovery(NODE, model, PREFIX, MQTT)[1]] for model in ("activity", "a/b")]
    done = subprocess.run([str(ha.HA_PYTHON), str(ROOT / "tests" / "homeassistant" / "schema_check.py")],
                          input=json.dumps(payloads), capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(done.stdout) == [""] * len(payloads)
    known = set(json.loads(subprocess.run([str(ha.HA_PYTHON), "-c", _STATE_KEYS], capture_output=True, text=True,
                                          timeout=120, check=True).stdout))
    for entry in (_entry("staged"), _entry("failed", error={"code": "gate", "message": "m"}), {"state": "idle"}):
        got = ha_update.state(entry, LATEST)
        assert set(got) <= known and all(isinstance(value, str) for value in got.values())


# A real Home Assistant: the wait limits only decide how long a failing test takes.
ENTITY = f"update.edge_inferd_{NODE}_fleet_activity"
HA_VERSION = "0.1.0"
PUBLISH_WAIT_S = 30.0


@pytest.fixture
def broker(tmp_path):
    with Broker(tmp_path / "broker") as b:
        yield b


@pytest.fixture
def home_assistant(tmp_path, broker):
    instance = ha.HomeAssistant(tmp_path / "ha", broker.port, PREFIX)
    try:
        yield instance.start()
    finally:
        instance.stop()


@pytest.fixture
def node(broker):
    """A client that publishes as the node does and reads the node's command topic."""
    client = Client(broker)
    client.subscribe(MQTT.fleet_cmd_topic)
    yield client
    client.close()


def _retain(client: Client, topic: str, payload) -> None:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    client.c.publish(topic, body, qos=1, retain=True).wait_for_publish(PUBLISH_WAIT_S)


def _attribute(key: str, value):
    return lambda states: states.get(ENTITY, {}).get("attributes", {}).get(key) == value


@needs_ha
def test_home_assistant_shows_the_staged_release_and_its_install_reaches_the_node(node, home_assistant):
    _retain(node, MQTT.status_topic, ha_discovery.ONLINE.encode())
    sensor_topic, sensor = ha_discovery.node_configs(MQTT, PREFIX, HA_VERSION)[0]
    _retain(node, sensor_topic, sensor)
    _retain(node, *ha_update.discovery(NODE, "activity", PREFIX, MQTT, HA_VERSION))
    # Retained, so HA reads it whenever it subscribes to the topic its discovery just named.
    _retain(node, ha_update.state_topic(MQTT, "activity"), ha_update.state(_entry("staged", staged=4), LATEST))
    entity = home_assistant.wait_for("the staged release", _attribute("latest_version", "1.3.0"))[ENTITY]
    assert entity["state"] == "on"
    assert {k: entity["attributes"][k] for k in ("installed_version", "title", "friendly_name", "release_url")} == {
        "installed_version": "1.2.0", "title": "activity", "friendly_name": "gw.1 activity model",
        "release_url": URL + "manifest.json"}
    assert entity["attributes"]["release_summary"].endswith(LATEST["summary"])
    assert entity["attributes"]["in_progress"] is False  # HA's own: 2024.3 reads none from MQTT
    same_device = "{{ device_id('%s') == device_id('sensor.%s') }}" % (ENTITY, sensor["object_id"])
    assert home_assistant.render(same_device) == "True"

    home_assistant.call_service("update", "install", {"entity_id": ENTITY})
    command = node.wait_count(MQTT.fleet_cmd_topic, 1)[0]
    assert command.payload.decode() == ha_update.install_payload("activity") and not command.retain
    assert json.loads(command.payload) == {"cmd": "install", "model": "activity"}

    # The node swapped it in: the canary runs the new version, so there is no update left to install.
    _retain(node, ha_update.state_topic(MQTT, "activity"), ha_update.state(_entry("canary", version="1.3.0"), LATEST))
    entity = home_assistant.wait_for("the installed release", _attribute("installed_version", "1.3.0"))[ENTITY]
    assert entity["state"] == "off" and entity["attributes"]["release_summary"].startswith("Canary: watching 1.3.0")
    with pytest.raises(urllib.error.HTTPError):  # HA itself refuses: "No update available"
        home_assistant.call_service("update", "install", {"entity_id": ENTITY})

    _retain(node, MQTT.status_topic, ha_discovery.OFFLINE.encode())
    home_assistant.wait_for("unavailable with the node offline",
                            lambda states: states.get(ENTITY, {}).get("state") == "unavailable")
    _retain(node, ha_update.removal(NODE, "activity", PREFIX), b"")
    home_assistant.wait_for("the entity removed", lambda s: ENTITY not in s)
    problems = [line for line in home_assistant.log().splitlines()
                if ("ERROR" in line or "WARNING" in line) and "mqtt" in line]
    assert problems == [], problems
