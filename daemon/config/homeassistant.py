"""The `homeassistant` section: Home Assistant MQTT discovery (daemon/obs/ha_discovery.py), read and checked.

The frozen section and its reader, like reuse.py. Off by default: a daemon that does not
ask for it publishes nothing under the discovery prefix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

from daemon.config.reader import Reader

DEFAULT_PREFIX = "homeassistant"  # Home Assistant's own default discovery prefix
DEFAULT_DEVICE_IDLE_S = 86400.0  # a day: a sensor that reports hourly, or less, keeps its entity
DEFAULT_MAX_DEVICES = 256


@dataclass(frozen=True)
class HomeAssistantConfig:
    discovery: bool = False
    """Publish Home Assistant MQTT discovery messages (retained): the node as one device with
    sensors read from the stats topic, and one entity per device seen on a route, whose state
    is its latest result (docs/homeassistant.md). Off: nothing is published under `prefix`."""
    prefix: str = DEFAULT_PREFIX
    """Home Assistant's discovery prefix (its MQTT integration's `discovery_prefix`)."""
    device_idle_s: float = DEFAULT_DEVICE_IDLE_S
    """A device whose requests stopped this long ago has its entity removed (an empty retained
    config); its next request announces it again. 0: never removed for being idle."""
    max_devices: int = DEFAULT_MAX_DEVICES
    """Entities (a device on a route; a device on two routes counts twice) announced at most.
    Past it a new device is not announced and is counted (`homeassistant.refused` in the stats)
    until an idle one is removed: the bound keeps a topic scan from flooding Home Assistant."""


def read_homeassistant(r: Reader, root: Mapping) -> HomeAssistantConfig:
    p, d = "homeassistant", HomeAssistantConfig()
    s = r.section(root, "homeassistant", HomeAssistantConfig)
    return HomeAssistantConfig(
        discovery=r.get(s, "discovery", p, bool, d.discovery),
        prefix=r.get(s, "prefix", p, str, d.prefix, check=_prefix_error),
        device_idle_s=float(r.get(s, "device_idle_s", p, (int, float), d.device_idle_s, minimum=0)),
        max_devices=r.get(s, "max_devices", p, int, d.max_devices, minimum=1),
    )


def _prefix_error(value: Optional[str]) -> Optional[str]:
    if not value:
        return "must not be empty"
    if "+" in value or "#" in value or value.startswith("/") or value.endswith("/"):
        return f"must be a topic without wildcards or a leading or trailing '/', got {value!r}"
    return None
