"""Test-side eyes on the broker and on an output stream, for the fleet controller's tests: waits
are on conditions, never on guessed sleeps."""

from __future__ import annotations

import io
import json
import threading
from typing import Callable, Optional

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from daemon.tools.broker import Broker
from daemon.transport.mqtt import stop_loop
from tests.fleet.fake_node import WAIT_S


class Watcher:
    """A plain MQTT client that keeps the latest retained document of each topic it follows."""

    def __init__(self, broker: Broker, *topics: str):
        self.cond = threading.Condition()
        self.latest: dict[str, Optional[dict]] = {}
        self._client = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
        self._client.on_message = self._on_message
        self._client.on_connect = lambda c, *a: c.subscribe([(t, 1) for t in topics])
        self._client.connect("127.0.0.1", broker.port)
        self._client.loop_start()

    def _on_message(self, client, userdata, msg) -> None:
        with self.cond:
            self.latest[msg.topic] = json.loads(msg.payload) if msg.payload else None
            self.cond.notify_all()

    def wait(self, topic: str, predicate: Callable[[dict], bool]) -> dict:
        with self.cond:
            assert self.cond.wait_for(lambda: self.latest.get(topic) is not None and predicate(self.latest[topic]),
                                      WAIT_S), f"{topic}: {self.latest.get(topic)}"
            return self.latest[topic]

    def publish(self, topic: str, doc: dict) -> None:
        self._client.publish(topic, json.dumps(doc), qos=1, retain=True).wait_for_publish(WAIT_S)

    def close(self) -> None:
        self._client.disconnect()
        stop_loop(self._client)


class Screen(io.StringIO):
    """An output stream a test can wait on."""

    def __init__(self):
        super().__init__()
        self.cond = threading.Condition()

    def write(self, text: str) -> int:
        with self.cond:
            n = super().write(text)
            self.cond.notify_all()
            return n

    def wait_for(self, text: str) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: text in self.getvalue(), WAIT_S), self.getvalue()
