"""The native link (daemon/transport/native.py) against a real mosquitto, next to the paho link.

Between the link and the broker sits a TCP relay that records every MQTT packet in both
directions, in the order it forwarded them, and can freeze a connection (drop its bytes both
ways without closing it: a half-open link). The orderings the delivery rules promise are read
off that record. Tests of rules both links hold run over both; rules only native keeps (the
broker's ReceiveMaximum) say so. The relay parses with the mqtt5 codec, so this module needs
the mqtt5 wheel (the test extra installs it).
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import threading
import time
from typing import Callable

import pytest

mqtt5 = pytest.importorskip("mqtt5", reason="the native transport needs the mqtt5 wheel (pip install -e '.[native]')")

from daemon.config.loader import load_config  # noqa: E402 - after the skip
from daemon.config.mqtt import MqttConfig  # noqa: E402
from daemon.tools.broker import Broker  # noqa: E402
from daemon.transport.inbound import Inbound  # noqa: E402
from daemon.transport.mqtt import MqttLink  # noqa: E402
from daemon.transport.native import NativeLink  # noqa: E402
from daemon.transport.link_common import Out  # noqa: E402
from daemon.transport.native_wire import Frames  # noqa: E402
from daemon.transport.outbox import Outbox, Row  # noqa: E402
from tests.integration.conftest import ROOT, WAIT_S, Client  # noqa: E402

LINKS = [pytest.param(MqttLink, id="paho"), pytest.param(NativeLink, id="native")]
UP, DOWN = "up", "down"  # link -> broker, broker -> link


class Relay:
    """A TCP relay to the broker that records (connection number, direction, packet) in order."""

    def __init__(self, broker_port: int):
        self._broker_port = broker_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self.cond = threading.Condition()
        self.events: list[tuple[int, str, object]] = []
        self.connections = 0
        self._frozen_upto = 0  # connections numbered up to this one are frozen
        self.hold_pubacks = False  # PUBACKs to the link wait until the link writes again
        self._held: dict[int, list[bytes]] = {}  # connection number -> PUBACKs held back
        self._links: dict[int, socket.socket] = {}  # connection number -> its link's side
        threading.Thread(target=self._accept, daemon=True).start()

    def freeze(self) -> None:
        """Every connection so far goes silent both ways and stays open (a half-open link)."""
        with self.cond:
            self._frozen_upto = self.connections

    def wait_for(self, predicate: Callable[[list], bool]) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: predicate(self.events), WAIT_S)

    def close(self) -> None:
        self._listener.close()

    def _holding(self, number: int, direction: str, packets: list, data: bytes) -> bytes:
        """What goes on now (cond held): with `hold_pubacks`, a broker that sends a client its
        PUBACKs only once the client writes again (mosquitto 2.0.11 under overload, docs/reliability.md)."""
        if direction != DOWN or not self.hold_pubacks:
            return data
        held = [p.write() for p in packets if isinstance(p, mqtt5.PubAckPacket)]
        self._held.setdefault(number, []).extend(held)
        return b"".join(p.write() for p in packets if not isinstance(p, mqtt5.PubAckPacket)) if held else data

    def _accept(self) -> None:
        while True:
            try:
                link_side, _ = self._listener.accept()
            except OSError:
                return
            broker_side = socket.create_connection(("127.0.0.1", self._broker_port))
            with self.cond:
                self.connections += 1
                number = self.connections
                self._links[number] = link_side
                self.cond.notify_all()
            for src, dst, direction in ((link_side, broker_side, UP), (broker_side, link_side, DOWN)):
                threading.Thread(target=self._pump, args=(src, dst, direction, number), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, direction: str, number: int) -> None:
        frames = Frames()
        while True:
            try:
                data = src.recv(1 << 16)
            except OSError:
                data = b""
            if number <= self._frozen_upto:
                if not data:
                    return  # frozen: the other side hears nothing, not even the close
                continue
            if not data:
                break
            with self.cond:
                packets = frames.feed(data)
                self.events.extend((number, direction, p) for p in packets)
                self.cond.notify_all()
                data = self._holding(number, direction, packets, data)
            try:
                dst.sendall(data)
                if direction == UP and self._held.get(number):
                    link_side = self._links[number]
                    with self.cond:
                        held, self._held[number] = self._held[number], []
                    link_side.sendall(b"".join(held))  # the link wrote: what was held goes to it now
            except OSError:
                break
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _of(events: list, direction: str, kind: type) -> list:
    return [p for _, d, p in events if d == direction and isinstance(p, kind)]


@pytest.fixture
def broker(tmp_path):
    with Broker(tmp_path / "broker") as b:
        yield b


@pytest.fixture
def relay(broker):
    r = Relay(broker.port)
    yield r
    r.close()


def _link(link_type, relay: Relay, on_burst=lambda burst: None, **mqtt) -> object:
    config = MqttConfig(broker=relay.address, client_id=mqtt.pop("client_id", "link-under-test"),
                        session_expiry_s=mqtt.pop("session_expiry_s", 0), **mqtt)
    return link_type(config, ["in/+"], on_burst, receive_maximum=64)


def _serve(link) -> None:
    link.start()
    link.open_intake()
    assert link.online.wait(WAIT_S), "the link never came online"


@pytest.mark.parametrize("link_type", LINKS)
def test_keepalive_pings_keep_an_idle_link_up(relay, link_type):
    link = _link(link_type, relay, keepalive_s=1)
    _serve(link)
    try:
        # mosquitto drops a client silent for 1.5 keepalives: two PINGREQs answered, one connection.
        assert relay.wait_for(lambda ev: len(_of(ev, DOWN, mqtt5.PingRespPacket)) >= 2)
        assert relay.connections == 1 and link.connected.is_set() and link.reconnects == 0
    finally:
        link.stop()


@pytest.mark.parametrize("link_type", LINKS)
def test_a_half_open_link_is_dropped_after_an_unanswered_ping_and_the_link_comes_back(relay, link_type, caplog):
    link = _link(link_type, relay, keepalive_s=1, reconnect_min_s=1, reconnect_max_s=1)
    _serve(link)
    try:
        relay.freeze()
        with caplog.at_level(logging.WARNING, logger="daemon.transport.link_health"):
            with relay.cond:  # a new connection: the link gave up on the silent one by itself
                assert relay.cond.wait_for(lambda: relay.connections >= 2, WAIT_S)
            deadline = time.monotonic() + WAIT_S
            while link.reconnects < 1 and time.monotonic() < deadline:
                link.online.wait(0.05)  # polled: `reconnects` has no event; the limit bounds a failure
        assert link.reconnects == 1  # subscribed and announced online again
        assert any("disconnected from" in r.getMessage() for r in caplog.records), caplog.text
    finally:
        link.stop()


@pytest.mark.parametrize("link_type", LINKS)
def test_a_request_is_acked_only_after_its_replys_puback(broker, relay, link_type):
    holder = {}
    link = _link(link_type, relay, on_burst=lambda burst: [holder["link"].reply("out/r", b"re:" + m.payload, m)
                                                          for m in burst])
    holder["link"] = link
    _serve(link)
    client = Client(broker)
    try:
        client.subscribe("out/r")
        client.publish("in/a", b"one")
        assert client.wait_count("out/r", 1)[0].payload == b"re:one"

        def acked(ev: list) -> bool:
            request = [p for p in _of(ev, DOWN, mqtt5.PublishPacket) if p.topic == "in/a"]
            return bool(request) and any(p.packet_id == request[0].packet_id for p in _of(ev, UP, mqtt5.PubAckPacket))
        assert relay.wait_for(acked)
        events = [(d, p) for _, d, p in relay.events]
        request = next(i for i, (d, p) in enumerate(events) if d == DOWN and getattr(p, "topic", "") == "in/a")
        reply = next(i for i, (d, p) in enumerate(events) if d == UP and getattr(p, "topic", "") == "out/r")
        reply_id = events[reply][1].packet_id
        reply_acked = next(i for i, (d, p) in enumerate(events) if d == DOWN and isinstance(p, mqtt5.PubAckPacket)
                           and p.packet_id == reply_id and i > reply)
        request_acked = next(i for i, (d, p) in enumerate(events) if d == UP and isinstance(p, mqtt5.PubAckPacket)
                             and p.packet_id == events[request][1].packet_id)
        assert request < reply < reply_acked < request_acked
    finally:
        client.close()
        link.stop()


def test_native_nudges_a_broker_that_holds_its_pubacks_until_the_link_writes(broker, relay):
    """mosquitto 2.0.11 at 2x overload kept a client's PUBACKs queued until that client wrote again;
    a link that then only waits never writes: its replies, and the requests behind them, stall (80,000
    requests at 8,000/s: 1,309-6,266 results, tests/integration/test_overload.py). The native link
    sends a PINGREQ once the broker has been silent for NUDGE_S while replies wait, well before its
    keepalive (60 s here)."""
    from daemon.transport.native_conn import NUDGE_S

    holder = {}
    link = _link(NativeLink, relay, keepalive_s=60,
                 on_burst=lambda burst: [holder["link"].reply("out/r", b"re:" + m.payload, m) for m in burst])
    holder["link"] = link
    _serve(link)
    client = Client(broker)
    try:
        client.subscribe("out/r")
        # From a quiet link: its `online` status is PUBACKed first. Held too (on a busy box it had not
        # come back yet), that PUBACK was let go by the reply's own write, and nothing needed a nudge.
        deadline = time.monotonic() + WAIT_S
        while link.unconfirmed_replies and time.monotonic() < deadline:
            link.online.wait(0.01)  # polled: the count has no event; the limit bounds a failure
        assert link.unconfirmed_replies == 0
        relay.hold_pubacks = True
        started = time.monotonic()
        client.publish("in/a", b"one")

        def request_acked(ev: list) -> bool:
            request = [p for p in _of(ev, DOWN, mqtt5.PublishPacket) if p.topic == "in/a"]
            return bool(request) and any(p.packet_id == request[0].packet_id for p in _of(ev, UP, mqtt5.PubAckPacket))
        with relay.cond:
            assert relay.cond.wait_for(lambda: request_acked(relay.events), 10 * NUDGE_S + 5.0)
        assert time.monotonic() - started < 60  # not the keepalive's PINGREQ
        assert _of(relay.events, UP, mqtt5.PingReqPacket) and link.nudges >= 1
    finally:
        client.close()
        link.stop()


def test_native_keeps_within_the_brokers_receive_maximum_and_queues_the_rest(broker, relay):
    """MQTT v5 forbids more QoS 1 publishes in flight than the CONNACK's ReceiveMaximum (mosquitto
    says 20). paho ignores it (its window is mqtt.py's REPLY_WINDOW), so this is native's alone."""
    link = _link(NativeLink, relay)
    _serve(link)
    client = Client(broker)
    n = 500
    try:
        client.subscribe("out/w")
        for k in range(n):
            link.publish("out/w", b"%d" % k)
        replies = client.wait_count("out/w", n)
        assert [m.payload for m in replies] == [b"%d" % k for k in range(n)]  # all, in order
        [connack] = _of(relay.events, DOWN, mqtt5.ConnAckPacket)
        in_flight, most = set(), 0
        for _, direction, packet in list(relay.events):
            if direction == UP and isinstance(packet, mqtt5.PublishPacket) and packet.packet_id is not None:
                in_flight.add(packet.packet_id)
                most = max(most, len(in_flight))
            elif direction == DOWN and isinstance(packet, mqtt5.PubAckPacket):
                in_flight.discard(packet.packet_id)
        assert most <= connack.receive_max < n
        deadline = time.monotonic() + WAIT_S
        while link.unconfirmed_replies and time.monotonic() < deadline:
            link.online.wait(0.01)  # polled: the count has no event; the limit bounds a failure
        assert link.unconfirmed_replies == 0
    finally:
        client.close()
        link.stop()


def test_native_reads_no_more_requests_than_its_receive_maximum_while_they_wait_unacked(broker, relay, tmp_path):
    """mosquitto 2.0.11 moves up to a client's ReceiveMaximum queued messages into flight on every
    in-order PUBACK, so past the first ack it writes all it holds. A link that read on held ~99,000
    requests unacked at 2x overload, and the broker's count for it passed max_queued_messages:
    "Outgoing messages are being dropped" (tests/integration/test_overload.py). The native link
    reads only while fewer than its ReceiveMaximum wait for their acks; a held window of answered
    requests is relieved through the outbox (safe_ack.py). Each burst must arrive while fewer than
    that many were read and not answered (one burst may overshoot)."""
    limit, n, size = 16, 160, 4096  # 4 KiB each: a 256 KiB read burst holds 64, fewer than the rest
    received: list[Inbound] = []
    answered: list[Inbound] = []
    early: list[int] = []  # read and unanswered when a burst came, where that was `limit` or more
    cond = threading.Condition()

    def on_burst(burst) -> None:
        with cond:
            if len(received) - len(answered) >= limit:
                early.append(len(received) - len(answered))
            received.extend(burst)
            cond.notify_all()

    def answer_all() -> None:
        with cond:
            todo = received[len(answered):]
            answered.extend(todo)  # before the replies: a request is acked only after its reply
        for m in todo:
            link.reply("out/r", b"re:" + m.payload[:4], m)

    config = MqttConfig(broker=relay.address, client_id="link-under-test", session_expiry_s=0)
    link = NativeLink(config, ["in/+"], on_burst, receive_maximum=limit, outbox=Outbox(tmp_path / "outbox", 1 << 24))
    _serve(link)
    client = Client(broker)
    try:
        client.subscribe("out/r")
        for k in range(n):
            client.publish("in/a", b"%04d" % k + bytes(size))
        with cond:
            assert cond.wait_for(lambda: len(received) >= limit, WAIT_S)  # what it sends before any ack
        answer_all()  # in-order PUBACKs: mosquitto now writes the rest at once
        assert relay.wait_for(lambda ev: sum(p.topic == "in/a" for p in _of(ev, DOWN, mqtt5.PublishPacket)) >= n)
        deadline = time.monotonic() + WAIT_S
        while link.unacked_holds < 1 and time.monotonic() < deadline:
            link.online.wait(0.01)  # polled: a counter has no event; the limit bounds a failure
        assert link.unacked_holds >= 1, f"the link read {len(received)} of {n} with {len(answered)} answered"
        while len(answered) < n:
            with cond:
                assert cond.wait_for(lambda: len(received) > len(answered), WAIT_S), (len(received), n)
            answer_all()
        assert not early, f"bursts came with {early} read and unanswered (limit {limit})"
        assert sorted(m.payload for m in client.wait_count("out/r", n)) == [b"re:%04d" % k for k in range(n)]
    finally:
        client.close()
        link.stop()


def test_a_v5_request_reaches_intake_with_its_expiry_response_topic_and_correlation(broker, relay):
    got, arrived = [], threading.Event()
    link = _link(NativeLink, relay, on_burst=lambda burst: (got.extend(burst), arrived.set()))
    _serve(link)
    publisher = mqtt5.PublishPacket("in/d1", b"{}", qos=mqtt5.QoS.AT_LEAST_ONCE, packet_id=1,
                                    message_expiry_interval=30, response_topic="me/replies",
                                    correlation_data=b"c-1").write()
    with socket.create_connection(("127.0.0.1", broker.port)) as sock:
        sock.sendall(mqtt5.ConnectPacket("pub-d1").write() + publisher)
        assert arrived.wait(WAIT_S)
    link.stop()
    [inbound] = got
    assert (inbound.topic, inbound.qos, inbound.payload) == ("in/d1", 1, b"{}") and inbound.mid > 0
    assert 0 < inbound.expiry_s <= 30  # what is left of it when delivered: the deadline admission uses
    assert (inbound.response_topic, inbound.correlation_data) == ("me/replies", b"c-1")


def test_at_stop_only_unconfirmed_replies_are_kept_in_the_outbox(tmp_path):
    """As the paho test of the same name (tests/transport/test_mqtt.py): status, stats, an outbox row
    being flushed and an escalation request are not replies the next run must send."""
    config = dataclasses.replace(load_config(ROOT / "config.yaml", check_models=False).mqtt, qos=1)
    link = NativeLink(config, ["sensors/+/imu"], lambda burst: None, outbox=Outbox(tmp_path / "outbox", 1 << 20))
    link._flusher.start()  # as NativeLink.start does; it waits for a connection that never comes
    request = Inbound("sensors/d1/imu", b"{}", 1, 5, time.monotonic(), correlation_data=b"c-1")
    link._publish(Out("results/d1/activity", b"reply", False, request.correlation_data, None, request))
    link.publish("edge-inferd/n/stats", b"{}", retain=True)
    link.publish("gpu/d1/imu", b"{}", correlation_data=b"esc-1", response_topic="edge-inferd/n/escalations")
    link._flush(Row(1, "results/d9/activity", b"stored", None))
    link.stop(0.1)
    kept = Outbox(tmp_path / "outbox", 1 << 20).oldest(10)
    assert [(r.topic, r.payload, r.correlation_data) for r in kept] == [("results/d1/activity", b"reply", b"c-1")]


@pytest.mark.parametrize("change,message", [
    ({"protocol": "3.1.1"}, "mqtt.transport: native speaks MQTT v5 only"),
    ({"qos": 2}, "mqtt.transport: native does QoS 0 and 1 only"),
])
def test_config_check_refuses_what_native_cannot_do_naming_mqtt_transport(tmp_path, change, message):
    from daemon.config.loader import load_config as load
    from daemon.errors import ConfigError
    from tests.integration.conftest import write_config

    path = write_config(tmp_path, transport="native", mqtt=change)
    with pytest.raises(ConfigError) as raised:
        load(path, check_models=False)
    assert message in str(raised.value)


@pytest.mark.parametrize("change,chosen", [
    ({}, "native"),  # protocol 5, qos 1, mqtt5 installed
    ({"protocol": "3.1.1"}, "paho"),
    ({"qos": 2}, "paho"),
])
def test_transport_auto_is_native_where_native_can_serve_else_paho(tmp_path, change, chosen):
    from daemon.config.loader import load_config as load
    from tests.integration.conftest import write_config

    assert load(write_config(tmp_path, transport="auto", mqtt=change), check_models=False).mqtt.transport == chosen


def test_the_default_is_one_transport_per_protocol():
    """No `mqtt.transport` written (the bundled config says `auto`; a config without the key, and
    MqttConfig built in code, alike): native on MQTT v5, paho on 3.1.1."""
    assert load_config(ROOT / "config.yaml", check_models=False).mqtt.transport == "native"
    assert MqttConfig().transport == "native"
    assert MqttConfig(protocol=311).transport == "paho"


def test_transport_auto_is_paho_without_the_mqtt5_package(tmp_path, monkeypatch):
    import importlib.util

    from daemon.config.loader import load_config as load
    from tests.integration.conftest import write_config

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mqtt5" else real(name, *a))
    assert load(write_config(tmp_path, transport="auto"), check_models=False).mqtt.transport == "paho"


def test_a_held_connection_is_not_read_until_reading_is_allowed_again():
    import socket

    from daemon.transport.native_conn import Connection

    ours, broker = socket.socketpair()
    wake_r, wake_w = socket.socketpair()
    try:
        conn = Connection(ours, Frames(), wake_r, keepalive_s=30.0)
        broker.sendall(mqtt5.PublishPacket("sensors/x/imu", b"{}", qos=mqtt5.QoS.AT_LEAST_ONCE,
                                           packet_id=1).write())
        assert conn.wait(reads=False) == (False, False)  # bytes wait in the kernel, unread
        assert conn.wait(reads=False) == (False, False)
        readable, _ = conn.wait(reads=True)
        assert readable and [p.topic for p in conn.read()] == ["sensors/x/imu"]
    finally:
        for s in (ours, broker, wake_r, wake_w):
            s.close()
