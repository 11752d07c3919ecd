"""Which devices Home Assistant has been told about (`homeassistant.discovery`), bounded.

A device is what a request topic's '+' levels capture (`sensors/dev7/imu` -> `dev7`; the
whole topic on a filter without '+'), and its entity on a route is keyed by the reply topic it
reads: two request topics that answer on one topic are one entity (a `publish` without
placeholders gives a route one entity, named after the route). `seen` runs on paho's network
thread for every request: a known entity costs one dict lookup and a float store, no lock;
only a new one takes the lock, builds its config and publishes it (retained). The main loop's
`tick` announces the node once online and removes entities idle past `device_idle_s`; a
reload's `reconfigure` removes those whose route went away or changed. Requests that carry a
v5 ResponseTopic are not tracked: their replies never reach the route's `publish` topic.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Optional

from daemon import __version__, topics
from daemon.config.homeassistant import HomeAssistantConfig
from daemon.config.mqtt import MqttConfig
from daemon.config.schema import Config, RouteConfig
from daemon.obs import ha_discovery
from daemon.pipeline import codecs

logger = logging.getLogger(__name__)

Publish = Callable[[str, bytes, bool], object]  # (topic, payload, retain): the link's publish
REMOVED = b""  # an empty retained config: Home Assistant deletes the entity


class _Entity:
    __slots__ = ("topic", "route_key", "last_seen")

    def __init__(self, topic: str, route_key: tuple, now: float):
        self.topic = topic  # its discovery config topic
        self.route_key = route_key
        self.last_seen = now


class DiscoveredDevices:
    """The entities announced to Home Assistant, bounded by `max_devices`; lives across reloads."""

    def __init__(self, config: Config):
        self._mqtt: MqttConfig = config.mqtt
        self._ha: HomeAssistantConfig = config.homeassistant
        self._routes = {route.name: route for route in config.routes}
        self._lock = threading.Lock()
        self._entities: dict[tuple[str, str], _Entity] = {}  # (route name, reply topic) -> entity
        self._publish: Optional[Publish] = None
        self._node_announced = False
        self._pending: list[str] = []  # config topics to empty once a link is online
        self.refused = 0  # new devices not announced: max_devices reached
        self.removed = 0  # entities removed: idle, or their route went away

    @property
    def enabled(self) -> bool:
        return self._ha.discovery

    def attach(self, publish: Publish) -> None:
        """The (new) link: the node is announced again on its first `tick` online."""
        self._publish = publish
        self._node_announced = False

    def seen(self, route: RouteConfig, topic: str, reply_topic: str, now: float) -> None:
        """paho's thread, every routed request: remember when the device was seen; announce a new one."""
        entity = self._entities.get((route.name, reply_topic))
        if entity is not None:
            entity.last_seen = now
            return
        if self.enabled:
            self._announce(route, topic, reply_topic, now)

    def _announce(self, route: RouteConfig, topic: str, reply_topic: str, now: float) -> None:
        with self._lock:
            key = (route.name, reply_topic)
            if key in self._entities or self._publish is None:
                return
            if len(self._entities) >= self._ha.max_devices:
                self.refused += 1
                return
            found = ha_discovery.entity_config(self._mqtt, self._ha.prefix, __version__, route,
                                               device_name(route, topic), reply_topic)
            if found is None:  # a `values` route: nothing to show; remembered so it is not built again
                self._entities[key] = _Entity("", ha_discovery.route_key(route), now)
                return
            config_topic, payload = found
            self._entities[key] = _Entity(config_topic, ha_discovery.route_key(route), now)
            if config_topic in self._pending:  # removed by a reload, back before the removal went out
                self._pending.remove(config_topic)
            # Under the lock, as the removals are: a removal and an announcement of one topic go out in order.
            self._publish(config_topic, codecs.encode(payload), True)

    def tick(self, now: float, online: bool) -> None:
        """The main loop: announce the node once online; remove the entities idle past device_idle_s."""
        if self._publish is None or not online:
            return
        if self.enabled and not self._node_announced:
            self._node_announced = True
            for config_topic, payload in ha_discovery.node_configs(self._mqtt, self._ha.prefix, __version__):
                self._publish(config_topic, codecs.encode(payload), True)
        idle_s = self._ha.device_idle_s
        if self.enabled and idle_s > 0:
            self._remove(lambda key, entity: now - entity.last_seen > idle_s, "idle")
        self._flush_removals()  # also after `discovery: false`: what an earlier config announced

    def reconfigure(self, config: Config) -> None:
        """A reload: entities of routes gone or changed are removed (announced again on their next
        request); a changed node id, prefix or `discovery: false` removes everything announced."""
        new_ha, new_mqtt = config.homeassistant, config.mqtt
        routes = {route.name: route for route in config.routes}
        if (new_ha.prefix, new_ha.discovery, new_mqtt.client_id) != (self._ha.prefix, self._ha.discovery,
                                                                    self._mqtt.client_id):
            self._remove(lambda key, entity: True, "reconfigured")
            self._remove_node()
        else:
            self._remove(lambda key, entity: key[0] not in routes
                         or ha_discovery.route_key(routes[key[0]]) != entity.route_key, "route changed")
        self._mqtt, self._ha, self._routes = new_mqtt, new_ha, routes

    def _remove(self, gone: Callable[[tuple[str, str], _Entity], bool], why: str) -> None:
        """Forget the entities `gone` picks; their empty configs go out on the next `tick` online
        (a reload removes them while no link is up)."""
        with self._lock:
            doomed = [(key, entity) for key, entity in self._entities.items() if gone(key, entity)]
            for key, entity in doomed:
                del self._entities[key]
                if entity.topic:
                    self._pending.append(entity.topic)
                    self.removed += 1
                    logger.info("homeassistant: removing %s of route %s (%s)", entity.topic, key[0], why)

    def _remove_node(self) -> None:
        if self._node_announced:
            self._pending.extend(config_topic for config_topic, _ in
                                 ha_discovery.node_configs(self._mqtt, self._ha.prefix, __version__))
        self._node_announced = False

    def _flush_removals(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
            for config_topic in pending:
                self._publish(config_topic, REMOVED, True)

    def snapshot(self) -> dict:
        """For the stats topic: entities announced now, refused for the bound, removed so far."""
        with self._lock:
            devices = sum(1 for entity in self._entities.values() if entity.topic)
        return {"devices": devices, "max_devices": self._ha.max_devices, "refused": self.refused,
                "removed": self.removed}


def device_name(route: RouteConfig, topic: str) -> str:
    """The device part of a request topic: its '+' captures, else the topic; the route's name when
    every device of the route answers on one topic (a `publish` without placeholders)."""
    if "{" not in route.publish:
        return route.name
    captures = topics.match(route.subscribe, topic)
    return "/".join(captures) if captures else topic
