"""Home Assistant's MQTT `update` entity for fleet delivery (pure: topics and JSON-ready dicts, no I/O).

One entity per node and managed model, on the node's device (the identifiers of
daemon/obs/ha_discovery.py's node device, so it joins the node's sensors). It reads a state
topic of its own, `edge-inferd/<client_id>/fleet/ha/<model>`, retained, whose JSON carries only
the keys Home Assistant knows (HA from 2024.11 drops a state message with an unknown key, so the
reported document itself cannot be that topic). Its Install button publishes `payload_install`,
`{"cmd": "install", "model": "<model>"}`, on the node's command topic (docs/fleet.md, "Command"):
HA's `update` has no default payload_install, and the command activates a staged release.

Checked against HA 2024.3.3's `homeassistant/components/mqtt/update.py`: its JSON state takes
`installed_version`, `latest_version`, `title`, `release_summary`, `release_url` and
`entity_picture`, nothing else (`title` goes in the config: the model's name, which the reported
entry does not carry). `in_progress` and `update_percentage` came with HA 2024.11, so
they are left out: what a node is doing (downloading, gating, canary) goes in front of the
release summary instead. HA shows "update available" when `latest_version` is newer than
`installed_version` (AwesomeVersion), or when the two cannot be compared, and its
`update.install` refuses while they are equal; versions are strings.

The node agent's part, per managed model (docs/homeassistant.md, "Fleet: one update entity"):
- on connect, and whenever the set of managed models changes: `discovery(...)` retained;
- with every reported document it publishes: `state(entry, latest)` retained on
  `state_topic(mqtt, model)`, where `entry` is the model's entry of that document and `latest`
  is `{"version": <the target manifest's version>, "summary": <its summary>}` once the target's
  manifest has been read (`record.target["version"]`, `record.summary`), else None;
- a model no longer managed: an empty retained message on `removal(...)` (HA deletes the entity)
  and on `state_topic(mqtt, model)` (HA ignores an empty state).
"""

from __future__ import annotations

import json
from typing import Optional

from daemon import __version__
from daemon.config.mqtt import MqttConfig
from daemon.fleet.node.records import CANARY, DOWNLOADING, FAILED, GATING, ROLLED_BACK, STAGED, VERIFYING
from daemon.obs import ha_discovery

UPDATE = "update"
# daemon/fleet/node/commands_node.py's command that activates a staged release (not imported from there:
# it imports the agent, which will import this module).
INSTALL = "install"
# HA keeps at most this much of a release summary (UpdateEntity.state_attributes truncates it).
SUMMARY_MAX = 255
_ELLIPSIS = "…"
# A model whose configured files run before its first release has no version: its sha256 stands in,
# prefixed so that AwesomeVersion never reads an all-digit hash as a number (HA: not comparable, so
# any release offered shows as an update).
_SHA_VERSION = "sha256:{}"
_NO_VERSION = "unknown"
_MANIFEST = "manifest.json"
_UNREAD = "the release"  # the target before its manifest is read
# The reported states in which the target is not on offer: it was refused.
_REFUSED_STATES = (FAILED, ROLLED_BACK)
# What the node is doing, shown before the summary (HA 2024.3 has no in_progress in the JSON state).
_DOING = {
    DOWNLOADING: "Downloading {version}{percent}.",
    VERIFYING: "Verifying {version}.",
    GATING: "Gating {version} on this node's data.",
    STAGED: "{version} passed the gate: Install activates it.",
    CANARY: "Canary: watching {version} on live traffic.",
}
_PERCENT = 100


def _object_name(model: str) -> str:
    return f"fleet_{ha_discovery.object_id(model)}"


def state_topic(mqtt: MqttConfig, model: str) -> str:
    """The entity's retained state topic (the model's name sanitized to one topic level)."""
    return f"edge-inferd/{mqtt.client_id}/fleet/ha/{ha_discovery.object_id(model)}"


def install_payload(model: str) -> str:
    """What HA publishes on the command topic when Install is pressed (docs/fleet.md, "Command")."""
    return json.dumps({"cmd": INSTALL, "model": model})


def discovery(node: str, model: str, prefix: str, mqtt_config: MqttConfig,
              version: str = __version__) -> tuple[str, dict]:
    """(config topic, payload) of the model's update entity; `node` is ha_discovery.node_id(mqtt_config)."""
    if node != ha_discovery.node_id(mqtt_config):
        # The config topic and ids would name one node and the device another.
        raise ValueError(f"node {node!r} is not {ha_discovery.node_id(mqtt_config)!r}, the node id of "
                         f"{mqtt_config.client_id!r}")
    name = _object_name(model)
    payload = {
        "name": f"{model} model",
        "title": model,  # the software's name; the JSON state never carries it, so it stays
        "unique_id": f"edge_inferd_{node}_{name}",
        "object_id": f"edge_inferd_{node}_{name}",
        "state_topic": state_topic(mqtt_config, model),
        "command_topic": mqtt_config.fleet_cmd_topic,
        "payload_install": install_payload(model),
        # A command is not retained (docs/fleet.md): a late subscriber must not install again.
        "retain": False,
        "qos": 1,
        "entity_category": "config",
        # No device_class: `firmware` is a device's own software; a model is not, and the title says what.
        "icon": "mdi:brain",
        "availability_topic": mqtt_config.status_topic,
        "payload_available": ha_discovery.ONLINE,
        "payload_not_available": ha_discovery.OFFLINE,
        "device": ha_discovery.node_device(mqtt_config, version),
        "origin": {**ha_discovery.ORIGIN, "sw_version": version},
    }
    return ha_discovery.config_topic(prefix, UPDATE, node, name), payload


def removal(node: str, model: str, prefix: str) -> str:
    """The config topic to empty (retained) when `model` stops being managed: HA deletes the entity."""
    return ha_discovery.config_topic(prefix, UPDATE, node, _object_name(model))


def installed_version(entry: dict) -> str:
    """The running release's version; before the first release, the configured files' sha256."""
    if entry.get("version") is not None:
        return str(entry["version"])
    if entry.get("sha256"):
        return _SHA_VERSION.format(entry["sha256"])
    return _NO_VERSION


def _truncate(text: str) -> str:
    return text if len(text) <= SUMMARY_MAX else text[:SUMMARY_MAX - len(_ELLIPSIS)] + _ELLIPSIS


def _doing(entry: dict, version: str) -> str:
    """What the node is doing with the target, one sentence, or '' when at rest."""
    text = _DOING.get(entry.get("state", ""))
    if text is None:
        return ""
    progress, percent = entry.get("progress") or {}, ""
    if progress.get("total"):
        percent = f" ({_PERCENT * progress.get('bytes', 0) // progress['total']}%)"
    return text.format(version=version, percent=percent)


def _refusal(entry: dict, version: str) -> str:
    error = entry.get("error") or {}
    what = f"{version} refused" if version else "Refused"
    if entry.get("state") == ROLLED_BACK:
        what = f"Rolled back from {version}" if version else "Rolled back"
    return f"{what} ({error.get('code', '?')}): {error.get('message', '')}".rstrip(": ")


def _release_url(entry: dict) -> Optional[str]:
    """The target's signed manifest (its summary, claims and files): the release directory may have no index."""
    url = (entry.get("target") or {}).get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        return None
    return f"{url.rstrip('/')}/{_MANIFEST}"


def state(model_report: dict, latest: Optional[dict]) -> dict:
    """The entity's JSON state from the model's entry of the reported document (docs/fleet.md).

    `latest`: `{"version": str, "summary": str}` of the target's manifest once read, else None.
    `latest_version` is that version while the target is on offer or under way, the installed one
    when there is none or it was refused (HA then shows no update, and the summary says why)."""
    installed = installed_version(model_report)
    version = str((latest or {}).get("version") or "")
    summary = str((latest or {}).get("summary") or "")
    out = {"installed_version": installed, "latest_version": version or installed}
    if model_report.get("state") in _REFUSED_STATES:
        out["latest_version"] = installed
        summary = _refusal(model_report, version)
    else:
        summary = " ".join(part for part in (_doing(model_report, version or _UNREAD), summary) if part)
    out["release_summary"] = _truncate(summary)
    url = _release_url(model_report)
    if url is not None:
        out["release_url"] = url
    return out
