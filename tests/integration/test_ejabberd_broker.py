"""The private ejabberd (tests/integration/ejabberd.py) as a second broker: it starts, carries
v5 QoS 1, and keeps a session across a client's drop but not across its own restart
(mod_mqtt keeps sessions in RAM tables only). Skipped where ejabberd is not installed."""

from __future__ import annotations

import os
import socket
import threading
from typing import Optional

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from daemon.errors import DaemonError
from tests.integration.conftest import WAIT_S, Client
from tests.integration.ejabberd import Ejabberd, find_ejabberd

try:
    find_ejabberd()
    _MISSING = ""
except DaemonError as exc:
    _MISSING = str(exc)

pytestmark = pytest.mark.skipif(bool(_MISSING), reason=_MISSING)
# Within mod_mqtt's default cap (session_expiry: 5 minutes), so CONNACK grants it as asked.
SESSION_EXPIRY_S = 300


@pytest.fixture
def ejabberd(tmp_path):
    with Ejabberd(tmp_path / "ejabberd") as b:
        yield b
        b.kill()  # the test is over: a clean stop (test_stop_ends_the_vm... has its own) took the VM ~1 s


class Persistent:
    """A v5 client with a persistent session (clean_start false) that records CONNACK's session-present flag."""

    def __init__(self, broker: Ejabberd, client_id: str):
        self.session_present: Optional[bool] = None
        self.payloads: list[bytes] = []
        self.cond = threading.Condition()
        self.c = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=paho.MQTTv5)
        self.c.username_pw_set(broker.username, broker.password)
        self.c.on_connect = self._connected
        self.c.on_message = self._message
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = SESSION_EXPIRY_S
        self.c.connect("127.0.0.1", broker.port, clean_start=False, properties=props)
        self.c.loop_start()

    def _connected(self, client, userdata, flags, reason, props) -> None:
        with self.cond:
            self.session_present = flags.session_present
            self.cond.notify_all()

    def _message(self, client, userdata, msg) -> None:
        with self.cond:
            self.payloads.append(msg.payload)
            self.cond.notify_all()

    def wait_connack(self) -> bool:
        with self.cond:
            assert self.cond.wait_for(lambda: self.session_present is not None, WAIT_S), "no CONNACK"
            return self.session_present

    def subscribe(self, topic: str) -> None:
        done = threading.Event()
        self.c.on_subscribe = lambda *a: done.set()
        self.c.subscribe(topic, qos=1)
        assert done.wait(WAIT_S), f"subscription to {topic} not acknowledged"

    def wait_payload(self, payload: bytes) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: payload in self.payloads, WAIT_S), f"no {payload!r}"

    def drop(self) -> None:
        """Close the socket without DISCONNECT, like a SIGKILLed process."""
        self.c.loop_stop()
        self.c.socket().close()


def test_it_starts_and_carries_v5_qos1(ejabberd):
    client = Client(ejabberd)
    try:
        client.subscribe("probe/q1")
        client.publish("probe/q1", b"hello", qos=1)
        [msg] = client.wait_count("probe/q1", 1)
        assert msg.payload == b"hello" and msg.qos == 1
    finally:
        client.close()


def test_a_connect_without_a_user_name_is_refused(ejabberd):
    refused = []
    c = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    c.connect("127.0.0.1", ejabberd.port)
    got = threading.Event()
    c.on_connect = lambda client, userdata, flags, reason, props: (refused.append(reason.value), got.set())
    c.loop_start()
    try:
        assert got.wait(WAIT_S), "no CONNACK"
        assert refused == [0x87]  # Not authorized
    finally:
        c.loop_stop()


def test_a_session_outlives_a_client_drop_but_not_a_broker_restart(ejabberd):
    sub = Persistent(ejabberd, "keeper")
    sub.wait_connack()
    sub.subscribe("probe/s")
    sub.drop()
    pub = Client(ejabberd)
    try:
        pub.publish("probe/s", b"while-away")
        back = Persistent(ejabberd, "keeper")
        assert back.wait_connack() is True
        back.wait_payload(b"while-away")
        back.drop()

        ejabberd.stop()
        ejabberd.start()
        again = Persistent(ejabberd, "keeper")
        assert again.wait_connack() is False  # mod_mqtt's mqtt_session table lives in RAM
        again.drop()
    finally:
        pub.close()


def test_stop_ends_the_vm_and_a_taken_port_fails_naming_the_log(tmp_path):
    b = Ejabberd(tmp_path / "a").start()
    pid = b._proc.pid
    b.stop()
    assert not os.path.exists(f"/proc/{pid}")
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", b.port), timeout=1).close()

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(DaemonError, match="ejabberd.log"):
            Ejabberd(tmp_path / "b", port=taken.getsockname()[1]).start()


def _disconnect_reason(client: Persistent) -> threading.Event:
    """An event set when the broker disconnects `client`; the v5 reason code lands in client.reason."""
    done = threading.Event()

    def on_disconnect(c, userdata, flags, reason, props) -> None:
        client.reason = reason.value
        done.set()
    client.c.on_disconnect = on_disconnect
    return done


def test_a_shared_subscription_is_answered_with_disconnect_0x9e(ejabberd):
    """No SUBACK refusal: mod_mqtt drops the connection (Shared Subscriptions not supported)."""
    client = Persistent(ejabberd, "sharer")
    client.wait_connack()
    done = _disconnect_reason(client)
    client.c.subscribe("$share/g/probe/t", qos=1)
    assert done.wait(WAIT_S) and client.reason == 0x9E
    client.c.loop_stop()


def test_the_older_of_two_connections_with_one_id_gets_disconnect_0x8e(ejabberd):
    first = Persistent(ejabberd, "twin")
    first.wait_connack()
    done = _disconnect_reason(first)
    first.c.reconnect_delay_set(WAIT_S, WAIT_S)  # so that it does not take the session back meanwhile
    second = Persistent(ejabberd, "twin")
    try:
        assert second.wait_connack() is True
        assert done.wait(WAIT_S) and first.reason == 0x8E  # Session taken over
    finally:
        first.c.loop_stop()
        second.drop()
