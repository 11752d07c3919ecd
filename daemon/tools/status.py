"""`edge-inferd status`: read a node's retained status and stats from the broker, print a table.

Retained messages arrive right after SUBSCRIBE; the command waits until none has come for
a short while (or a time limit passes), then prints one block per node. `NodeFeed` follows the
topics; `--watch` (status_watch.py) keeps it open and redraws the table.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional

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


class NodeFeed:
    """The latest status and stats of each node, kept current by paho's thread."""

    def __init__(self, broker: str, client_id: Optional[str], clock: Callable[[], float] = time.time):
        """`clock` stamps each node's stats (`stats_at`, the wall clock by default)."""
        try:
            self._address = parse_broker(broker)
        except ValueError as exc:
            raise ConfigError([f"--broker: {exc}"]) from None
        self._filter = client_id or "+"
        self._clock = clock
        self._lock = threading.Lock()
        self._nodes: dict[str, dict] = {}
        self.changed = threading.Event()  # set at each message
        self.last_at = time.monotonic()  # when the last message came
        self._client = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
        self._client.on_message = self._on_message
        self._client.on_connect = self._on_connect
        if self._address.tls:  # mqtts://: the system's trust store, hostname verified
            self._client.tls_set()

    def start(self) -> None:
        """Connect (OSError when the broker cannot be reached) and follow the topics."""
        self._client.connect(self._address.host, self._address.port)
        self._client.loop_start()

    def stop(self) -> None:
        self._client.disconnect()
        stop_loop(self._client)

    def nodes(self) -> dict[str, dict]:
        with self._lock:
            return {name: dict(node) for name, node in self._nodes.items()}

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        node = self._filter
        client.subscribe([(f"edge-inferd/{node}/status", 1), (f"edge-inferd/{node}/stats", 1)])

    def _on_message(self, client, userdata, msg) -> None:
        parts = msg.topic.split("/")
        with self._lock:
            node = self._nodes.setdefault(parts[1], {})
            if parts[2] == "status":
                node["status"] = msg.payload.decode(errors="replace")
                self._touch()
                return
            try:
                node["stats"] = orjson.loads(msg.payload)
            except orjson.JSONDecodeError:
                node["stats"] = {}
            node["stats_at"] = self._clock()
            self._touch()

    def _touch(self) -> None:
        self.last_at = time.monotonic()
        self.changed.set()


def fetch(broker: str, client_id: Optional[str], timeout_s: float = TIMEOUT_S) -> dict[str, dict]:
    """{node id: {"status": str, "stats": dict}} from the retained topics."""
    feed = NodeFeed(broker, client_id)
    feed.start()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            feed.changed.wait(QUIET_S)
            feed.changed.clear()
            if feed.nodes() and time.monotonic() - feed.last_at >= QUIET_S:
                break
    finally:
        feed.stop()
    return feed.nodes()


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
