"""Home Assistant discovery's device tracker: announce once, bound, idle removal, reload."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from daemon.config.homeassistant import HomeAssistantConfig
from daemon.config.loader import load_config
from daemon.serve.ha_devices import REMOVED, DiscoveredDevices, device_name

ROOT = Path(__file__).resolve().parents[2]
BASE = load_config(ROOT / "config.yaml", check_models=False)


def _config(**ha):
    return replace(BASE, homeassistant=HomeAssistantConfig(discovery=True, **ha))


class Wire:
    def __init__(self):
        self.sent: list[tuple[str, bytes, bool]] = []

    def __call__(self, topic, payload, retain):
        self.sent.append((topic, payload, retain))

    def configs(self):
        return [(t, json.loads(p)) for t, p, _ in self.sent if p]

    def removed(self):
        return [t for t, p, _ in self.sent if p == REMOVED]


def _tracker(**ha):
    config = _config(**ha)
    devices, wire = DiscoveredDevices(config), Wire()
    devices.attach(wire)
    return devices, wire, {route.name: route for route in config.routes}


def test_a_device_is_announced_once_retained_and_the_node_once_online():
    devices, wire, routes = _tracker()
    devices.tick(0.0, online=False)
    assert wire.sent == []
    devices.tick(0.0, online=True)
    devices.tick(1.0, online=True)
    node = len(wire.sent)
    assert node == 6 and all(retain for _, _, retain in wire.sent)
    for now in (1.0, 2.0, 3.0):
        devices.seen(routes["activity"], "sensors/dev7/imu", "results/dev7/activity", now)
    devices.seen(routes["activity-raw"], "sensors/dev7/imu/raw", "results/dev7/activity", 3.0)
    (topic, payload), (raw_topic, _) = wire.configs()[node:]  # activity-raw: the same device, its own entity
    assert topic.startswith("homeassistant/sensor/") and topic.endswith("/activity_dev7/config")
    assert raw_topic.endswith("/activity-raw_dev7/config")
    assert payload["state_topic"] == "results/dev7/activity" and payload["device"]["name"] == "dev7"
    assert devices.snapshot()["devices"] == 2


def test_the_bound_refuses_new_devices_until_an_idle_one_is_removed():
    devices, wire, routes = _tracker(max_devices=2, device_idle_s=10)
    devices.tick(0.0, online=True)
    for i, now in ((1, 0.0), (2, 5.0), (3, 6.0)):
        devices.seen(routes["activity"], f"sensors/d{i}/imu", f"results/d{i}/activity", now)
    assert devices.snapshot() == {"devices": 2, "max_devices": 2, "refused": 1, "removed": 0}
    devices.tick(12.0, online=True)  # d1 last seen at 0: idle past 10 s
    assert [t.rsplit("/", 2)[-2] for t in wire.removed()] == ["activity_d1"]
    devices.seen(routes["activity"], "sensors/d3/imu", "results/d3/activity", 13.0)
    assert devices.snapshot()["devices"] == 2 and devices.snapshot()["removed"] == 1


def test_a_reload_removes_the_entities_of_a_route_gone_or_changed_once_a_link_is_up():
    devices, wire, routes = _tracker()
    devices.tick(0.0, online=True)
    devices.seen(routes["activity"], "sensors/a/imu", "results/a/activity", 1.0)
    devices.seen(routes["appliance"], "plugs/p/power", "results/p/appliance", 1.0)
    config = _config()
    kept = tuple(r for r in config.routes if r.name != "activity")
    devices.reconfigure(replace(config, routes=kept))
    assert wire.removed() == []  # no link during a reload's restart: sent on the next tick online
    devices.tick(2.0, online=True)
    assert [t.rsplit("/", 2)[-2] for t in wire.removed()] == ["activity_a"]
    devices.reconfigure(replace(config, homeassistant=HomeAssistantConfig(discovery=False)))
    devices.tick(3.0, online=True)
    assert len(wire.removed()) == 1 + 1 + 6  # appliance's entity and the node's six sensors
    assert not devices.enabled


def test_off_by_default_nothing_is_published():
    devices, wire = DiscoveredDevices(BASE), Wire()
    devices.attach(wire)
    devices.tick(0.0, online=True)
    devices.seen(BASE.routes[0], "sensors/a/imu", "results/a/activity", 1.0)
    assert wire.sent == []


def test_the_device_is_the_topics_captures_or_the_route_when_every_device_answers_on_one_topic():
    route = BASE.routes[0]
    assert device_name(route, "sensors/dev7/imu") == "dev7"
    assert device_name(replace(route, publish="results/all"), "sensors/dev7/imu") == route.name
    assert device_name(replace(route, subscribe="kitchen/imu", publish="r/{topic}"), "kitchen/imu") == "kitchen/imu"
