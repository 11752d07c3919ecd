"""Home Assistant MQTT discovery messages (pure: topics and JSON-ready dicts, no I/O).

The node is one Home Assistant device. Its availability is the retained status topic
(`online` / `offline`, the LWT), and its sensors read the retained stats topic with HA
templates. Each device seen on a route is a device of its own (`via_device`: the node) with
one entity per route: its state is the result (the label, the anomaly flag or the number of
detections, by output kind), its attributes the score and top_k or the detections, read from
the replies on the route's `publish` topic.

The keys are Home Assistant's full names (not the abbreviations of
homeassistant/components/mqtt/abbreviations.py), checked against the discovery schemas of
HA 2024.3's `mqtt.sensor` and `mqtt.binary_sensor` (tests/obs/test_ha_discovery.py, and
tests/integration/test_homeassistant.py against a running Home Assistant). A config topic is
`<prefix>/<component>/<node>/<object_id>/config`; removing an entity is an empty retained
message on it. See docs/homeassistant.md.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Optional

from daemon.config.mqtt import MqttConfig
from daemon.config.schema import ANOMALY, CLASSIFY, DETECT, RouteConfig

SENSOR, BINARY_SENSOR = "sensor", "binary_sensor"
ONLINE, OFFLINE = "online", "offline"  # the status topic's payloads (transport/link_common.py)
ORIGIN = {"name": "edge-inferd"}  # no support_url: the project names no public home yet
_ID_CHARS = re.compile(r"[^a-zA-Z0-9_-]")
_HASH_BYTES = 3  # 6 hex digits tell apart two names that sanitize alike (a.b and a_b)
# A reply that is an error (`{"id", "route", "error"}`) carries no result: the entity keeps its state.
_KEEP_STATE = "this.state"
_KEEP_ATTRIBUTES = "this.attributes | tojson"


def object_id(text: str) -> str:
    """`text` as an id HA accepts in a discovery topic ([a-zA-Z0-9_-]); a changed one gets a hash."""
    clean = _ID_CHARS.sub("_", text)
    if clean == text:
        return text
    return f"{clean}_{hashlib.blake2b(text.encode(), digest_size=_HASH_BYTES).hexdigest()}"


def node_id(mqtt: MqttConfig) -> str:
    return object_id(mqtt.client_id)


def config_topic(prefix: str, component: str, node: str, object_name: str) -> str:
    return f"{prefix}/{component}/{node}/{object_name}/config"


def _availability(mqtt: MqttConfig) -> dict:
    return {"availability_topic": mqtt.status_topic, "payload_available": ONLINE,
            "payload_not_available": OFFLINE}


def node_device(mqtt: MqttConfig, version: str) -> dict:
    return {"identifiers": [f"edge_inferd_{node_id(mqtt)}"], "name": mqtt.client_id, "manufacturer": "edge-inferd",
            "model": "inference node", "sw_version": version}


@dataclass(frozen=True)
class NodeSensor:
    key: str
    name: str
    value_template: str
    unit: Optional[str] = None
    state_class: Optional[str] = "measurement"
    icon: Optional[str] = None


def _stat(path: str, scale: str = "") -> str:
    """A template for one number of the stats JSON, `None` (HA: unknown) while it is absent."""
    return f"{{{{ (value_json.{path}{scale}) | round(2) if value_json.{path} is defined else 'None' }}}}"


NODE_SENSORS = (
    NodeSensor("requests_per_s", "Requests per second", _stat("requests_per_s"), "req/s", icon="mdi:speedometer"),
    NodeSensor("latency_p99", "Latency p99", _stat("latency_ms.p99"), "ms", icon="mdi:timer-outline"),
    NodeSensor("errors", "Errors", "{{ value_json.errors.values() | sum }}", None, "total_increasing",
               "mdi:alert-circle-outline"),
    NodeSensor("cache_hit_rate", "Cache hit rate", _stat("cache.hit_rate", " * 100"), "%", icon="mdi:cached"),
    NodeSensor("models_loaded", "Models loaded",
               "{{ value_json.models.values() | selectattr('loaded') | list | count }}", None, icon="mdi:brain"),
    NodeSensor("devices", "Discovered devices", "{{ value_json.homeassistant.devices "
               "if value_json.homeassistant is defined else 'None' }}", None, icon="mdi:devices"),
)


def node_configs(mqtt: MqttConfig, prefix: str, version: str) -> list[tuple[str, dict]]:
    """(config topic, payload) of each of the node's sensors, all reading the stats topic."""
    node = node_id(mqtt)
    out = []
    for sensor in NODE_SENSORS:
        payload = {
            "name": sensor.name,
            "unique_id": f"edge_inferd_{node}_{sensor.key}",
            "object_id": f"edge_inferd_{node}_{sensor.key}",
            "state_topic": mqtt.stats_topic,
            "value_template": sensor.value_template,
            "entity_category": "diagnostic",
            **_availability(mqtt),
            "device": node_device(mqtt, version),
            "origin": {**ORIGIN, "sw_version": version},
        }
        if sensor.unit is not None:
            payload["unit_of_measurement"] = sensor.unit
        if sensor.state_class is not None:
            payload["state_class"] = sensor.state_class
        if sensor.icon is not None:
            payload["icon"] = sensor.icon
        out.append((config_topic(prefix, SENSOR, node, sensor.key), payload))
    return out


def _tojson(fields: str, present: str, keep: str = _KEEP_ATTRIBUTES) -> str:
    return f"{{{{ ({{{fields}}} | tojson) if value_json.{present} is defined else ({keep}) }}}}"


def _result_templates(route: RouteConfig) -> Optional[tuple[str, dict]]:
    """The component and the templates of a route's entity, by output kind (None: not announced)."""
    if route.kind == CLASSIFY:
        return SENSOR, {
            "value_template": f"{{{{ value_json.label if value_json.label is defined else {_KEEP_STATE} }}}}",
            "json_attributes_template": _tojson("'score': value_json.score, 'top_k': value_json.top_k, "
                                                "'latency_ms': value_json.latency_ms", "label"),
            "icon": "mdi:tag-outline"}
    if route.kind == DETECT:
        return SENSOR, {
            "value_template": "{{ value_json.detections | count if value_json.detections is defined "
                              f"else {_KEEP_STATE} }}}}",
            "json_attributes_template": _tojson("'detections': value_json.detections, "
                                                "'latency_ms': value_json.latency_ms", "detections"),
            "unit_of_measurement": "objects", "state_class": "measurement", "icon": "mdi:cctv"}
    if route.kind == ANOMALY and route.threshold is not None:
        # An error reply renders '', matching neither payload: the binary sensor keeps its state.
        return BINARY_SENSOR, {
            "value_template": "{{ ('ON' if value_json.anomaly else 'OFF') if value_json.anomaly is defined "
                              "else '' }}",
            "payload_on": "ON", "payload_off": "OFF", "device_class": "problem",
            "json_attributes_template": _tojson("'anomaly_score': value_json.anomaly_score, "
                                                "'threshold': value_json.threshold, "
                                                "'latency_ms': value_json.latency_ms", "anomaly")}
    if route.kind == ANOMALY:  # no threshold: the score is the state
        return SENSOR, {
            "value_template": "{{ value_json.anomaly_score if value_json.anomaly_score is defined "
                              "else 'None' }}",
            "state_class": "measurement", "icon": "mdi:chart-bell-curve"}
    return None  # values: outputs by tensor name, no one state to show


def entity_config(mqtt: MqttConfig, prefix: str, version: str, route: RouteConfig, device: str,
                  state_topic: str) -> Optional[tuple[str, dict]]:
    """(config topic, payload) of one device's entity on one route; None for a `values` route."""
    found = _result_templates(route)
    if found is None:
        return None
    component, templates = found
    node = node_id(mqtt)
    name = object_id(f"{route.name}_{device}")
    device_key = object_id(device)
    payload = {
        "name": route.name,
        "unique_id": f"edge_inferd_{node}_{name}",
        "object_id": f"edge_inferd_{node}_{name}",
        "state_topic": state_topic,
        "json_attributes_topic": state_topic,
        **templates,
        **_availability(mqtt),
        "device": {"identifiers": [f"edge_inferd_{node}_{device_key}"], "name": device,
                   "via_device": node_device(mqtt, version)["identifiers"][0]},
        "origin": {**ORIGIN, "sw_version": version},
    }
    return config_topic(prefix, component, node, name), payload


def route_key(route: RouteConfig) -> tuple:
    """What an entity's config depends on: a reload that changes it removes the route's entities."""
    return (route.name, route.subscribe, route.publish, route.kind, route.threshold is None)
