"""The controller's one MQTT connection: follows the nodes' reported documents, their desired
documents and a model's rollout record (all retained), and publishes with QoS 1.

Everything received is kept in memory by paho's thread under one condition (`cond`); `seq`
counts messages, so a waiter wakes on any change instead of polling. `start()` returns once the
retained messages are all in: after SUBACK it publishes a token to a topic of its own and waits
for it to come back. mosquitto queues a subscription's retained messages before it handles the
next packet of the same connection, so the token arrives after them (a settle of "no message for
0.5 s" would guess instead). On a reconnect (a broker restart) paho's thread connects again and
`_on_connect` subscribes again; the retained documents arrive again and replace the old ones.
"""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Callable, Optional

import orjson
import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from daemon.config.mqtt import parse_broker
from daemon.fleet.controller.record import ABORTING, RUNNING, RolloutRecord, topic as record_topic

logger = logging.getLogger(__name__)

REPORTED_FILTER = "edge-inferd/+/fleet/reported"
DESIRED_PREFIX = "edge-inferd/fleet/desired/node/"
SYNC_PREFIX = "edge-inferd/fleet/controller/"  # + <client id>/sync: the start-up token (no retained)
QOS = 1
START_TIMEOUT_S = 10.0
PUBLISH_TIMEOUT_S = 30.0  # per try; a broker away longer is waited for again (the publish is kept)
PUBLISH_TRIES = 20
# paho reconnects after 1 s, doubling up to this: a restarted broker is found again within 2 s.
RECONNECT_MIN_S = 0.2
RECONNECT_MAX_S = 2.0


def desired_topic(node: str) -> str:
    return DESIRED_PREFIX + node


def cmd_topic(node: str) -> str:
    return f"edge-inferd/{node}/fleet/cmd"


class ControllerLink:
    """`start()`, then read `reported`, `desired`, `record()` under `cond`; `publish()`; `stop()`."""

    def __init__(self, broker: str, model: Optional[str]):
        """`model`: whose rollout record to follow (None: none, for `fleet status`).
        ValueError (for the operator) on a bad `broker`."""
        self._address = parse_broker(broker)
        self._model = model
        self.client_id = f"edge-inferd-fleet-{uuid.uuid4().hex[:12]}"
        self._sync_topic = f"{SYNC_PREFIX}{self.client_id}/sync"
        self.cond = threading.Condition()
        self.seq = 0
        self.reported: dict[str, dict] = {}
        self.reports: dict[str, int] = {}  # node -> reported documents received (a command's answer is a later one)
        # Every reported document in order, so the controller sees each state a node passed through,
        # not only the latest; a few hundred bytes per state change, for one rollout's lifetime.
        self.report_log: list[tuple[str, Optional[dict]]] = []
        self.desired: dict[str, dict] = {}
        self.records: list[bytes] = []  # every record payload received, in order (`fleet abort` reads the order)
        self._synced = False
        self._acked: set[int] = set()  # message ids whose PUBACK came, until publish() takes them
        self._watching: Optional[RolloutRecord] = None
        self.abort_requested = False
        self.superseded: Optional[RolloutRecord] = None
        self._client = paho.Client(CallbackAPIVersion.VERSION2, client_id=self.client_id, protocol=paho.MQTTv5)
        self._client.reconnect_delay_set(RECONNECT_MIN_S, RECONNECT_MAX_S)
        self._client.on_connect = self._on_connect
        self._client.on_subscribe = self._on_subscribe
        self._client.on_message = self._on_message
        self._client.on_publish = self._on_publish
        if self._address.tls:  # mqtts://: the system's trust store, hostname verified
            self._client.tls_set()

    def start(self) -> None:
        """Connect and wait for the retained documents; OSError when the broker cannot be reached."""
        self._client.connect(self._address.host, self._address.port)
        self._client.loop_start()
        with self.cond:
            if not self.cond.wait_for(lambda: self._synced, START_TIMEOUT_S):
                self.stop()
                raise OSError(f"the broker did not answer the subscriptions within {START_TIMEOUT_S:.0f} s")

    def stop(self) -> None:
        self._client.disconnect()
        # loop_stop() races paho's thread ending (eclipse-paho #872): take the thread once, join it.
        thread = self._client._thread
        self._client._thread_terminate = True
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def record(self) -> Optional[RolloutRecord]:
        """The latest rollout record of the model (None: none, or not one)."""
        with self.cond:
            return RolloutRecord.from_json(self.records[-1]) if self.records else None

    def watch(self, record: RolloutRecord) -> None:
        """From now on, a record of this release set to `aborting` raises `abort_requested`, and one
        of another release set running (`--force`) sets `superseded`. Latched: the controller's own
        next update may overwrite the retained `aborting` before it reads it."""
        with self.cond:
            self._watching = record

    def publish(self, topic: str, payload: bytes, retain: bool) -> None:
        """QoS 1, returning once the broker has it (PUBACK). While the link is down paho keeps the
        message and sends it after reconnecting; a try that times out publishes again, which a
        retained document and a command the node answers once survive."""
        for _ in range(PUBLISH_TRIES):
            mid = self._client.publish(topic, payload, qos=QOS, retain=retain).mid
            # Not info.wait_for_publish(): it raises at once when the link is down (rc NO_CONN), though
            # paho has queued the message and will send it; on_publish reports the PUBACK either way.
            with self.cond:
                if self.cond.wait_for(lambda: mid in self._acked, PUBLISH_TIMEOUT_S):
                    self._acked.discard(mid)
                    return
            logger.info("no PUBACK for %s within %.0f s; publishing again", topic, PUBLISH_TIMEOUT_S)
        raise OSError(f"the broker did not take a message for {topic}")

    def wait(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        with self.cond:
            return self.cond.wait_for(predicate, timeout_s)

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        if reason_code.is_failure:
            logger.info("broker refused the connection: %s", reason_code)
            return
        topics = [(REPORTED_FILTER, QOS), (DESIRED_PREFIX + "+", QOS), (self._sync_topic, QOS)]
        if self._model is not None:
            topics.append((record_topic(self._model), QOS))
        client.subscribe(topics)

    def _on_subscribe(self, client, userdata, mid, reason_codes, properties) -> None:
        client.publish(self._sync_topic, b"sync", qos=QOS)

    def _on_publish(self, client, userdata, mid, reason_code, properties) -> None:
        with self.cond:
            self._acked.add(mid)
            self.cond.notify_all()

    def _on_message(self, client, userdata, msg) -> None:
        with self.cond:
            self.seq += 1
            if msg.topic == self._sync_topic:
                self._synced = True
            elif self._model is not None and msg.topic == record_topic(self._model):
                self._take_record(msg.payload)
            elif msg.topic.startswith(DESIRED_PREFIX):
                _keep(self.desired, msg.topic[len(DESIRED_PREFIX):], msg.payload)
            else:
                node = msg.topic.split("/")[1]
                _keep(self.reported, node, msg.payload)
                self.report_log.append((node, self.reported.get(node)))
                self.reports[node] = self.reports.get(node, 0) + 1
            self.cond.notify_all()

    def _take_record(self, payload: bytes) -> None:
        self.records.append(payload)
        record, mine = RolloutRecord.from_json(payload), self._watching
        if record is None or mine is None:
            return
        if record.same_release(mine.release, mine.serial):
            self.abort_requested = self.abort_requested or record.state == ABORTING
        elif record.state == RUNNING:
            self.superseded = record


def _keep(docs: dict[str, dict], name: str, payload: bytes) -> None:
    """An empty payload clears a retained document; one that is not a JSON object is dropped."""
    try:
        doc = orjson.loads(payload) if payload else None
    except orjson.JSONDecodeError:
        doc = None
    if isinstance(doc, dict):
        docs[name] = doc
    else:
        docs.pop(name, None)
