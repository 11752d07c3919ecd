"""The fuzz property of tests/test_fuzz.py, through each link and a real broker (each of brokers.py).

tests/test_fuzz.py feeds intake directly; here the same kinds of request bytes (and some past
one 64 KiB read, split across reads) go through mosquitto and the link under test (paho or
native) into the daemon's real serving (one worker, the bundled activity model). Every request
must get exactly one reply, on its v5 ResponseTopic when it has one, carrying its
CorrelationData, of a contract code, and be acked once after it: read off the recording relay.
"""

from __future__ import annotations

import itertools
import json
import socket
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

mqtt5 = pytest.importorskip("mqtt5", reason="the native transport needs the mqtt5 package (a default dependency on CPython >= 3.11)")

from daemon.config.loader import load_config  # noqa: E402 - after the skip
from daemon.config.mqtt import MqttConfig  # noqa: E402
from daemon.config.schema import BatchingConfig, WorkersConfig  # noqa: E402
from daemon.errors import ERROR_CODES  # noqa: E402
from daemon.model.runtime import Model  # noqa: E402
from daemon.obs.stats import Stats  # noqa: E402
from daemon.pipeline.route_pipeline import route_pipeline  # noqa: E402
from daemon.serve import wiring  # noqa: E402
from tests.integration import brokers  # noqa: E402
from daemon.transport.mqtt import MqttLink  # noqa: E402
from daemon.transport.native import NativeLink  # noqa: E402
from tests.integration.conftest import ROOT, WAIT_S  # noqa: E402
from tests.test_fuzz import requests  # noqa: E402 - the same request strategy
from tests.transport.test_native import DOWN, UP, Relay  # noqa: E402

REQUEST_TOPIC, RESULT_TOPIC, RESPONSE_TOPIC = "sensors/f1/imu", "results/f1/activity", "fz/replies"
# Past one recv() and split across reads; built from a short seed (hypothesis draws ~8 KiB at most).
big_payloads = st.tuples(st.integers(65_000, 140_000), st.binary(min_size=1, max_size=64)).map(
    lambda t: (t[1] * (t[0] // len(t[1]) + 1))[:t[0]])


def _connect(client_id: str, broker) -> "mqtt5.ConnectPacket":
    """A clean v5 CONNECT, with the broker's login where it takes registered users only (ejabberd), and
    a keepalive (rumqttd closes a CONNECT whose keepalive is 0)."""
    login = getattr(broker, "username", None)
    if login:
        return mqtt5.ConnectPacket(client_id, clean_start=True, keep_alive=600, username=login,
                                   password=broker.password.encode())
    return mqtt5.ConnectPacket(client_id, clean_start=True, keep_alive=600)


class Collector:
    """A raw v5 subscriber: replies by CorrelationData."""

    def __init__(self, broker):
        self.cond = threading.Condition()
        self.replies: dict[bytes, list[tuple[str, bytes]]] = {}
        self.sock = socket.create_connection(("127.0.0.1", broker.port))
        self.sock.sendall(_connect("fuzz-collector", broker).write())  # SUBSCRIBE after CONNACK: rumqttd
        self.subscribed = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        assert self.subscribed.wait(WAIT_S)

    def _read(self) -> None:
        from daemon.transport.native_wire import Frames
        frames = Frames()
        while data := self.sock.recv(1 << 16):
            for packet in frames.feed(data):
                if isinstance(packet, mqtt5.ConnAckPacket):
                    filters = [mqtt5.TopicFilter(t, max_qos=mqtt5.QoS.AT_MOST_ONCE)
                               for t in (RESULT_TOPIC, RESPONSE_TOPIC)]
                    self.sock.sendall(mqtt5.SubscribePacket(1, filters).write())
                elif isinstance(packet, mqtt5.SubAckPacket):
                    self.subscribed.set()
                elif isinstance(packet, mqtt5.PublishPacket):
                    with self.cond:
                        self.replies.setdefault(packet.correlation_data, []).append((packet.topic, packet.payload))
                        self.cond.notify_all()


class Publisher:
    def __init__(self, broker):
        self.sock = socket.create_connection(("127.0.0.1", broker.port))
        self.sock.sendall(_connect("fuzz-publisher", broker).write())
        self.ids = itertools.count(1)

    def send(self, payload: bytes, correlation: bytes, response_topic) -> None:
        mid = next(self.ids) % 0xFFFF + 1
        self.sock.sendall(mqtt5.PublishPacket(REQUEST_TOPIC, payload, qos=mqtt5.QoS.AT_LEAST_ONCE, packet_id=mid,
                                              correlation_data=correlation, response_topic=response_topic).write())


def _rigs() -> list:
    """The v5 link (native) on every broker; paho over v5 (its fallback where mqtt5 is missing) on mosquitto."""
    out = [pytest.param((MqttLink, brokers.MOSQUITTO), id="paho-mosquitto")]
    for kind in brokers.params():
        out.append(pytest.param((NativeLink, kind.values[0]), id=f"native-{kind.id}", marks=kind.marks))
    return out


@pytest.fixture(scope="module", params=_rigs())
def rig(request, tmp_path_factory):
    link_type, broker_name = request.param
    config = load_config(ROOT / "config.yaml")
    route = config.routes[0]
    pipe = route_pipeline(config, route, Model(config.models["activity"].path))
    models = {"activity": Model(config.models["activity"].path, max_batch=8)}
    serving = wiring.build([pipe], None, Stats(), WorkersConfig(max=1), lambda i: models, BatchingConfig(max_batch=8))
    with brokers.KINDS[broker_name].make(tmp_path_factory.mktemp("fuzz-broker")) as broker:
        relay = Relay(broker.port)
        login = {"username": broker.username, "password": broker.password} if getattr(broker, "username", None) else {}
        link = link_type(MqttConfig(broker=relay.address, client_id="fuzz-link", session_expiry_s=0, **login),
                         serving.filters, serving.intake.on_burst, receive_maximum=64)
        serving.attach(link)
        serving.start()
        link.start()
        link.open_intake()
        assert link.online.wait(WAIT_S)
        yield relay, Collector(broker), Publisher(broker)
        link.stop()
        relay.close()


def _acked_once_after_delivery(events: list, correlations: set) -> bool:
    """Each request delivered once to the link, and the link's PUBACK for it came after."""
    open_ids, delivered, acked = {}, {}, set()
    for _, direction, packet in events:
        if direction == DOWN and isinstance(packet, mqtt5.PublishPacket) and packet.correlation_data in correlations:
            delivered[packet.correlation_data] = delivered.get(packet.correlation_data, 0) + 1
            open_ids[packet.packet_id] = packet.correlation_data
        elif direction == UP and isinstance(packet, mqtt5.PubAckPacket) and packet.packet_id in open_ids:
            acked.add(open_ids.pop(packet.packet_id))
    return all(delivered.get(c) == 1 for c in correlations) and acked >= correlations


_EXAMPLES = itertools.count()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                                  HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.one_of(requests, big_payloads), st.booleans()), min_size=1, max_size=8))
def test_every_request_through_the_link_gets_one_reply_and_one_ack(rig, cases):
    relay, collector, publisher = rig
    example = next(_EXAMPLES)
    expected = {}
    for k, (payload, with_response_topic) in enumerate(cases):
        correlation = b"%d-%d" % (example, k)
        expected[correlation] = RESPONSE_TOPIC if with_response_topic else RESULT_TOPIC
        publisher.send(payload, correlation, RESPONSE_TOPIC if with_response_topic else None)
    with collector.cond:
        assert collector.cond.wait_for(lambda: all(c in collector.replies for c in expected), WAIT_S)
    assert relay.wait_for(lambda ev: _acked_once_after_delivery(ev, set(expected)))
    for correlation, topic in expected.items():
        [(got_topic, payload)] = collector.replies[correlation]  # exactly one reply
        assert got_topic == topic
        reply = json.loads(payload)
        if "error" in reply:
            assert reply["error"]["code"] in ERROR_CODES and reply["error"]["code"] != "internal", reply
        else:
            assert reply["route"] == "activity" and "label" in reply
