"""`edge-inferd status`: read a node's retained status and stats from the broker, print a table.

Retained messages arrive right after SUBSCRIBE; the command waits until none has come for
a short while (or a time limit passes), then prints one block per node.
"""

from __future__ import annotations

import threading
import time
from typing import Optional

import orjson
import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from daemon.config.mqtt import parse_broker
from daemon.errors import ConfigError
from daemon.transport.mqtt import stop_loop

# The retained messages are complete once nothing new came for this long.
QUIET_S = 0.5
TIMEOUT_S = 5.0
_PCT = 100.0


def fetch(broker: str, client_id: Optional[str], timeout_s: float = TIMEOUT_S) -> dict[str, dict]:
    """{node id: {"status": str, "stats": dict}} from the retained topics."""
    try:
        address = parse_broker(broker)
    except ValueError as exc:
        raise ConfigError([f"--broker: {exc}"]) from None
    nodes: dict[str, dict] = {}
    changed = threading.Event()
    last = [time.monotonic()]

    def on_message(client, userdata, msg) -> None:
        parts = msg.topic.split("/")
        node = nodes.setdefault(parts[1], {})
        if parts[2] == "status":
            node["status"] = msg.payload.decode(errors="replace")
        else:
            try:
                node["stats"] = orjson.loads(msg.payload)
            except orjson.JSONDecodeError:
                node["stats"] = {}
        last[0] = time.monotonic()
        changed.set()

    client = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    client.on_message = on_message
    if address.tls:  # mqtts://: the system's trust store, hostname verified
        client.tls_set()
    client.connect(address.host, address.port)
    node = client_id or "+"
    client.subscribe([(f"edge-inferd/{node}/status", 1), (f"edge-inferd/{node}/stats", 1)])
    client.loop_start()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            changed.wait(QUIET_S)
            changed.clear()
            if nodes and time.monotonic() - last[0] >= QUIET_S:
                break
    finally:
        client.disconnect()
        stop_loop(client)
    return nodes


def render(nodes: dict[str, dict]) -> str:
    return "\n\n".join(_block(name, node) for name, node in sorted(nodes.items()))


def _block(name: str, node: dict) -> str:
    s = node.get("stats", {})
    latency, queue, cache = s.get("latency_ms", {}), s.get("queue", {}), s.get("cache", {})
    outbox = s.get("outbox") if isinstance(s.get("outbox"), dict) else {}
    errors = " ".join(f"{code}={n}" for code, n in sorted(s.get("errors", {}).items())) or "none"
    models = ", ".join(f"{m} {v.get('sha256', '?')}{'' if v.get('loaded') else ' (unloaded)'}"
                       for m, v in sorted(s.get("models", {}).items())) or "?"
    rows = [
        f"node {name}: {node.get('status', 'unknown')}" + (f" (up {s['uptime_s']:.0f} s)" if "uptime_s" in s else ""),
        f"  requests   received {s.get('received', '?')}  results {s.get('results', '?')}  errors {errors}",
        f"  latency    p50 {latency.get('p50', '-')} ms  p99 {latency.get('p99', '-')} ms",
        f"  queue      depth {queue.get('depth', '?')}  busy {queue.get('busy', '?')}  bytes {queue.get('bytes', '?')}"
        f"  predicted wait {queue.get('predicted_wait_ms', '?')} ms",
        f"  cache      hit rate {cache.get('hit_rate', 0.0) * _PCT:.0f}%  entries {cache.get('entries', 0)}"
        f"  disk {cache.get('disk', 'off')}",
        f"  models     {models}",
        f"  link       reconnects {s.get('reconnects', '?')}  unconfirmed {outbox.get('unconfirmed', '?')}"
        f"  outbox {outbox.get('stored', 'off')} stored, {outbox.get('dropped', 0)} dropped",
    ]
    return "\n".join(rows)
