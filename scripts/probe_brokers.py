"""The same broker-only probes on mosquitto, rumqttd and ejabberd (paho v5 clients, no daemon).

Each probe starts its own private broker (`Broker` = mosquitto 2.0 with disk persistence and
autosave_interval 1, daemon/tools/broker.py; `Rumqttd` = rumqttd 0.20 and `Ejabberd` = ejabberd
23.01 mod_mqtt, tests/integration/) in a temporary directory on a free port, and prints one JSON
line per (broker, probe).
A probe, not a test: it measures and asserts nothing; waits are fixed caps or "quiet for 1.5 s".

Probes:
- restart_keeps_queued: a persistent subscriber (session expiry 3600, clean_start False, QoS 1)
  disconnects; 50 QoS 1 messages are published; the broker is stopped (SIGTERM) and started;
  the subscriber reconnects: how many of the 50 arrive, and CONNACK's session_present.
- sigkill_keeps_queued: the same, but 2 s after the publishes the broker is SIGKILLed.
- dead_share_member: A and B, persistent, in `$share/g/probe/share`; A's socket is closed without
  DISCONNECT; 100 messages are published; how many B gets, how many A gets on its return under
  its client id, how many were lost (and duplicated). ejabberd refuses `$share`: the refusal.
- takeover: raw sockets; a second CONNECT with the first's client id: whether the first gets a
  DISCONNECT packet and its reason code (or a bare TCP close, or nothing).
- expiry_in_queue: to an offline persistent subscriber, 10 messages with MessageExpiryInterval 1
  and 10 with 60; it reconnects after 3 s: how many of each arrive (0 of the first if expiry is
  honoured), and the expiry left that the second carry.
- receive_maximum: a manual-ack subscriber with ReceiveMaximum 10, 200 messages published: the
  most delivered before it acks any, then the total once it has acked just those.
- full_window_puback: a manual-ack subscriber is sent 150 messages (it acks none); it then
  publishes one QoS 1 message: is that PUBACKed within 5 s?

Run: python scripts/probe_brokers.py [--broker mosquitto|rumqttd|ejabberd ...] [--probe NAME ...] [--markdown]
(no --broker / --probe: all of them). A broker that is not installed gets a `not installed` line.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Callable, Optional

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from daemon.tools.broker import Broker, find_mosquitto  # noqa: E402
from tests.integration.ejabberd import Ejabberd, find_ejabberd  # noqa: E402
from tests.integration.rumqttd import Rumqttd, find_rumqttd  # noqa: E402

HOST = "127.0.0.1"
EXPIRY_S = 3600
WAIT_S = 10.0  # cap on any one wait
QUIET_S = 1.5  # a wait for "everything" ends once nothing new came for this long
BROKERS: dict[str, tuple[Callable[[Path], object], Callable[[], object]]] = {
    "mosquitto": (Broker, find_mosquitto),
    "rumqttd": (Rumqttd, find_rumqttd),
    "ejabberd": (Ejabberd, find_ejabberd),
}


class Peer:
    """A paho v5 client that records CONNACKs, DISCONNECTs, SUBACKs and messages; no auto-reconnect
    (a reconnect is a new Peer), so what the broker does to one connection stays visible."""

    def __init__(self, broker, client_id: str = "", persistent: bool = False, manual_ack: bool = False,
                 receive_maximum: Optional[int] = None):
        self.c = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=paho.MQTTv5,
                             manual_ack=manual_ack, reconnect_on_failure=False)
        if getattr(broker, "username", None) is not None:
            self.c.username_pw_set(broker.username, broker.password)
        self.cond = threading.Condition()
        self.connacks: list[tuple[bool, int]] = []  # (session_present, reason code)
        self.disconnects: list[tuple[int, str]] = []
        self.subacks: list[list[int]] = []
        self.messages: list[paho.MQTTMessage] = []
        self.c.on_connect = self._on_connect
        self.c.on_disconnect = self._on_disconnect
        self.c.on_subscribe = self._on_subscribe
        self.c.on_message = self._on_message
        props = Properties(PacketTypes.CONNECT)
        if persistent:
            props.SessionExpiryInterval = EXPIRY_S
        if receive_maximum is not None:
            props.ReceiveMaximum = receive_maximum
        self.c.connect(HOST, broker.port, clean_start=not persistent, properties=props)
        self.c.loop_start()
        if not self.wait(lambda: self.connacks or self.disconnects):
            raise RuntimeError(f"no CONNACK for {client_id!r} within {WAIT_S:.0f}s")
        if self.connacks[-1][1] >= 0x80:
            raise RuntimeError(f"CONNACK refused {client_id!r}: 0x{self.connacks[-1][1]:02X}")

    @property
    def session_present(self) -> Optional[bool]:
        return self.connacks[-1][0] if self.connacks else None

    def _on_connect(self, client, userdata, flags, reason, props) -> None:
        with self.cond:
            self.connacks.append((bool(flags.session_present), reason.value))
            self.cond.notify_all()

    def _on_disconnect(self, client, userdata, flags, reason, props) -> None:
        with self.cond:
            self.disconnects.append((reason.value, str(reason)))
            self.cond.notify_all()

    def _on_subscribe(self, client, userdata, mid, reasons, props) -> None:
        with self.cond:
            self.subacks.append([r.value for r in reasons])
            self.cond.notify_all()

    def _on_message(self, client, userdata, msg) -> None:
        with self.cond:
            self.messages.append(msg)
            self.cond.notify_all()

    def wait(self, predicate: Callable[[], object], timeout: float = WAIT_S) -> bool:
        with self.cond:
            return bool(self.cond.wait_for(predicate, timeout))

    def subscribe(self, topic: str) -> str:
        """'ok', or what the broker said instead of granting QoS 1."""
        n, d = len(self.subacks), len(self.disconnects)
        self.c.subscribe(topic, qos=1)
        self.wait(lambda: len(self.subacks) > n or len(self.disconnects) > d)
        if len(self.subacks) > n:
            codes = self.subacks[n]
            return "ok" if codes == [1] else f"SUBACK 0x{codes[0]:02X}"
        if len(self.disconnects) > d:
            return f"DISCONNECT 0x{self.disconnects[d][0]:02X} ({self.disconnects[d][1]})"
        return "no SUBACK"

    def settle(self, want: int, timeout: float = WAIT_S) -> int:
        """Wait until `want` messages came, or none came for QUIET_S, or `timeout`; the count."""
        deadline = time.monotonic() + timeout
        while True:
            with self.cond:
                n = len(self.messages)
                left = deadline - time.monotonic()
                if n >= want or left <= 0:
                    return n
                self.cond.wait_for(lambda: len(self.messages) > n, min(QUIET_S, left))
                if len(self.messages) == n and time.monotonic() < deadline:
                    return n

    def payloads(self) -> list[str]:
        with self.cond:
            return [m.payload.decode() for m in self.messages]

    def drop(self) -> None:
        """Close the socket without DISCONNECT, like a SIGKILLed process."""
        self.c.loop_stop()
        sock = self.c.socket()
        if sock is not None:
            sock.close()

    def close(self) -> None:
        try:
            if self.c.is_connected():
                self.c.disconnect()
        finally:
            self.c.loop_stop()


def publish_all(peer: Peer, topic: str, payloads: list[str], expiry: Optional[int] = None) -> int:
    """Publish at QoS 1; the number PUBACKed within WAIT_S."""
    props = None
    if expiry is not None:
        props = Properties(PacketTypes.PUBLISH)
        props.MessageExpiryInterval = expiry
    infos = [peer.c.publish(topic, p, qos=1, properties=props) for p in payloads]
    deadline = time.monotonic() + WAIT_S
    for info in infos:
        try:
            info.wait_for_publish(max(0.0, deadline - time.monotonic()))
        except (RuntimeError, ValueError):
            pass
    return sum(_acked(i) for i in infos)


def _acked(info: paho.MQTTMessageInfo) -> bool:
    try:
        return info.is_published()
    except (RuntimeError, ValueError):
        return False


# ---- raw MQTT v5 packets, for what paho would hide -----------------------------------------

def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _utf8(text: str) -> bytes:
    data = text.encode()
    return len(data).to_bytes(2, "big") + data


def connect_packet(client_id: str, username: Optional[str], password: Optional[str]) -> bytes:
    """CONNECT v5, clean_start False, keepalive 30 s, SessionExpiryInterval 3600."""
    flags = (0x80 if username is not None else 0) | (0x40 if password is not None else 0)
    props = b"\x11" + EXPIRY_S.to_bytes(4, "big")
    body = _utf8("MQTT") + b"\x05" + bytes([flags]) + (30).to_bytes(2, "big") + _varint(len(props)) + props
    body += _utf8(client_id)
    body += (_utf8(username) if username is not None else b"") + (_utf8(password) if password is not None else b"")
    return b"\x10" + _varint(len(body)) + body


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def read_packet(sock: socket.socket) -> tuple[int, bytes]:
    """(packet type byte, body); EOFError on a TCP close, TimeoutError past the socket's timeout."""
    first = _recv_exact(sock, 1)[0]
    length, shift = 0, 0
    while True:
        byte = _recv_exact(sock, 1)[0]
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    return first, _recv_exact(sock, length)


# ---- probes: each takes a started broker, returns its measurements ----------------------------

def _queued_across(broker, how: str) -> dict:
    sub = Peer(broker, "rkq-sub", persistent=True)
    sub.subscribe("probe/rkq")
    sub.close()
    pub = Peer(broker, "rkq-pub")
    acked = publish_all(pub, "probe/rkq", [str(i) for i in range(50)])
    pub.close()
    if how == "kill":
        time.sleep(2.0)  # mosquitto autosaves every 1 s
        broker.kill()
    else:
        broker.stop()
    broker.start()
    back = Peer(broker, "rkq-sub", persistent=True)
    back.settle(50)
    got = back.payloads()
    back.close()
    return {"published": 50, "pubacked": acked, "received": len(got), "distinct": len(set(got)),
            "session_present": back.session_present}


def probe_restart_keeps_queued(broker) -> dict:
    return _queued_across(broker, "stop")


def probe_sigkill_keeps_queued(broker) -> dict:
    return _queued_across(broker, "kill")


def probe_dead_share_member(broker) -> dict:
    topic, n = "probe/share", 100
    a = Peer(broker, "share-a", persistent=True)
    said = a.subscribe(f"$share/g/{topic}")
    if said != "ok":
        a.drop()
        return {"refused": said}
    b = Peer(broker, "share-b", persistent=True)
    said_b = b.subscribe(f"$share/g/{topic}")
    a.drop()
    time.sleep(1.0)  # for the broker to see the TCP close
    pub = Peer(broker, "share-pub")
    acked = publish_all(pub, topic, [str(i) for i in range(n)])
    b.settle(n)
    live = b.payloads()
    a2 = Peer(broker, "share-a", persistent=True)
    a2.settle(n - len(live))
    dead = a2.payloads()
    time.sleep(0.5)
    live_total = b.payloads()
    for p in (a2, b, pub):
        p.close()
    counts = Counter(live_total + dead)
    return {"published": n, "pubacked": acked, "b_subscribe": said_b, "live_got": len(live),
            "live_got_after_return": len(live_total) - len(live), "dead_got_on_return": len(dead),
            "dead_session_present": a2.session_present, "lost": n - len(set(counts) & {str(i) for i in range(n)}),
            "duplicates": sum(c - 1 for c in counts.values())}


def probe_takeover(broker) -> dict:
    user, password = getattr(broker, "username", None), getattr(broker, "password", None)
    socks = []
    try:
        connacks = []
        for _ in range(2):
            s = socket.create_connection((HOST, broker.port), timeout=WAIT_S)
            socks.append(s)
            s.sendall(connect_packet("probe-same-id", user, password))
            kind, body = read_packet(s)
            connacks.append(f"0x{body[1]:02X} sp={body[0] & 1}" if kind == 0x20 and len(body) > 1 else hex(kind))
        first = socks[0]
        first.settimeout(5.0)
        t0 = time.monotonic()
        try:
            kind, body = read_packet(first)
            if kind == 0xE0:
                code = body[0] if body else 0
                told, reason = "DISCONNECT", f"0x{code:02X}"
            else:
                told, reason = f"packet 0x{kind:02X}", None
        except EOFError:
            told, reason = "TCP close, no DISCONNECT", None
        except (TimeoutError, socket.timeout):
            told, reason = "nothing within 5 s", None
        return {"first_connack": connacks[0], "second_connack": connacks[1], "first_got": told,
                "reason_code": reason, "after_s": round(time.monotonic() - t0, 2)}
    finally:
        for s in socks:
            s.close()


def probe_expiry_in_queue(broker) -> dict:
    topic = "probe/expiry"
    sub = Peer(broker, "exp-sub", persistent=True)
    sub.subscribe(topic)
    sub.close()
    pub = Peer(broker, "exp-pub")
    publish_all(pub, topic, [f"short-{i}" for i in range(10)], expiry=1)
    publish_all(pub, topic, [f"long-{i}" for i in range(10)], expiry=60)
    pub.close()
    time.sleep(3.0)
    back = Peer(broker, "exp-sub", persistent=True)
    back.settle(20, 5.0)
    with back.cond:
        got = [(m.payload.decode(), getattr(m.properties, "MessageExpiryInterval", None)) for m in back.messages]
    back.close()

    def left(prefix: str) -> list:
        return sorted({e for p, e in got if p.startswith(prefix)}, key=lambda e: -1 if e is None else e)
    return {"session_present": back.session_present, "expiry_1s_published": 10,
            "expiry_1s_delivered_after_3s": sum(p.startswith("short") for p, _ in got),
            "expiry_1s_delivered": [p for p, _ in got if p.startswith("short")],
            "expiry_1s_left_on_delivery": left("short"),
            "expiry_60s_published": 10, "expiry_60s_delivered": sum(p.startswith("long") for p, _ in got),
            "expiry_60s_left_on_delivery": left("long")}


def probe_receive_maximum(broker) -> dict:
    topic, n = "probe/rm", 200
    sub = Peer(broker, "rm-sub", manual_ack=True, receive_maximum=10)
    sub.subscribe(topic)
    pub = Peer(broker, "rm-pub")
    acked = publish_all(pub, topic, [str(i) for i in range(n)])
    unacked = sub.settle(n)
    with sub.cond:
        pending = list(sub.messages)
    for m in pending:
        sub.c.ack(m.mid, m.qos)
    after = sub.settle(n, 3.0)
    for p in (sub, pub):
        p.close()
    return {"receive_maximum": 10, "published": n, "pubacked": acked, "delivered_before_any_ack": unacked,
            "delivered_after_acking_those": after}


def probe_full_window_puback(broker) -> dict:
    topic, n = "probe/fw", 150
    sub = Peer(broker, "fw-sub", manual_ack=True)
    sub.subscribe(topic)
    pub = Peer(broker, "fw-pub")
    acked = publish_all(pub, topic, [str(i) for i in range(n)])
    unacked = sub.settle(n)
    t0 = time.monotonic()
    info = sub.c.publish("probe/fw-reply", b"reply", qos=1)
    try:
        info.wait_for_publish(5.0)
    except (RuntimeError, ValueError):
        pass
    ok = _acked(info)
    waited = round(time.monotonic() - t0, 3)
    for p in (sub, pub):
        p.close()
    return {"published_to_it": n, "pubacked": acked, "delivered_unacked": unacked, "own_publish_pubacked_5s": ok,
            "puback_wait_s": waited}


PROBES: dict[str, Callable[[object], dict]] = {
    name[len("probe_"):]: fn for name, fn in globals().items() if name.startswith("probe_")}


# ---- one short cell per result, for --markdown ----------------------------------------------

def _sp(value: Optional[bool]) -> str:
    return "?" if value is None else str(int(value))


def cell(probe: str, r: dict) -> str:
    if "not_installed" in r:
        return "not installed"
    if "error" in r:
        return r["error"].split("\n")[0][:60]
    if probe in ("restart_keeps_queued", "sigkill_keeps_queued"):
        return f"{r['distinct']}/50, session_present {_sp(r['session_present'])}"
    if probe == "dead_share_member":
        if "refused" in r:
            return f"$share refused: {r['refused'].split(' (')[0]}"
        text = f"live {r['live_got']}, dead on return {r['dead_got_on_return']}, lost {r['lost']}"
        return text + (f", dup {r['duplicates']}" if r["duplicates"] else "")
    if probe == "takeover":
        return f"DISCONNECT {r['reason_code']}" if r["first_got"] == "DISCONNECT" else r["first_got"]
    if probe == "expiry_in_queue":
        left = ",".join(str(e) for e in r["expiry_60s_left_on_delivery"]) or "-"
        short = ",".join(str(e) for e in r["expiry_1s_left_on_delivery"])
        return (f"1 s: {r['expiry_1s_delivered_after_3s']}/10 delivered" + (f" (left {short})" if short else "")
                + f"; 60 s: {r['expiry_60s_delivered']}/10, left {left}")
    if probe == "receive_maximum":
        return (f"{r['delivered_before_any_ack']} before any ack (asked 10); "
                f"{r['delivered_after_acking_those']} once those are acked")
    if probe == "full_window_puback":
        return f"{'yes' if r['own_publish_pubacked_5s'] else 'no'} ({r['delivered_unacked']} unacked)"
    return json.dumps(r)


def run(broker_name: str, probe: str) -> dict:
    make, find = BROKERS[broker_name]
    try:
        find()
    except Exception as exc:  # DaemonError: says how to install it
        return {"not_installed": str(exc)}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"probe-{broker_name}-{probe}-") as tmp:
        broker = make(Path(tmp) / "broker")
        try:
            broker.start()
            result = PROBES[probe](broker)
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            result = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            broker.close()
    return {**result, "seconds": round(time.monotonic() - t0, 1)}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--broker", action="append", choices=list(BROKERS), help="repeatable; default: all")
    parser.add_argument("--probe", action="append", choices=list(PROBES), help="repeatable; default: all")
    parser.add_argument("--markdown", action="store_true", help="then print a table: probes x brokers")
    args = parser.parse_args(argv)
    brokers, probes = args.broker or list(BROKERS), args.probe or list(PROBES)
    table: dict[tuple[str, str], str] = {}
    for broker_name in brokers:
        for probe in probes:
            result = run(broker_name, probe)
            print(json.dumps({"broker": broker_name, "probe": probe, **result}), flush=True)
            table[probe, broker_name] = cell(probe, result)
    if args.markdown:
        print()
        print("| probe | " + " | ".join(brokers) + " |")
        print("|---|" + "---|" * len(brokers))
        for probe in probes:
            print(f"| {probe} | " + " | ".join(table[probe, b].replace("|", "/") for b in brokers) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
