"""What ejabberd 23.01's mod_mqtt guarantees, probed with paho and with the real daemon.

A probe, not a test: it prints what it saw, one `probe: result` line each, and asserts
nothing. Each probe starts its own private ejabberd (daemon/tools/ejabberd.py).
Run: python scripts/probe_ejabberd.py [probe ...]   (no argument: all of them)
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Optional

import paho.mqtt.client as paho
import yaml
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from daemon.config.reader import absolute_paths  # noqa: E402
from daemon.tools.broker import end_process  # noqa: E402
from daemon.tools.ejabberd import Ejabberd  # noqa: E402

WAIT_S = 30.0
SETTLE_S = 1.5  # a probe, not a test: time for the broker to hand out what it has


def _dump(props: Optional[Properties]) -> dict:
    return {} if props is None else {k: v for k, v in props.json().items()}


class Peer:
    """A paho client that records CONNACKs, DISCONNECTs and messages."""

    def __init__(self, broker: Ejabberd, client_id: str = "", expiry: Optional[int] = None,
                 protocol: int = paho.MQTTv5, manual_ack: bool = False, receive_maximum: Optional[int] = None,
                 clean: bool = True):
        self.c = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol,
                             manual_ack=manual_ack)
        self.c.username_pw_set(broker.username, broker.password)
        self.connacks: list[tuple] = []
        self.disconnects: list[tuple] = []
        self.messages: list[paho.MQTTMessage] = []
        self.cond = threading.Condition()
        self.c.on_connect = self._on_connect
        self.c.on_disconnect = self._on_disconnect
        self.c.on_message = self._on_message
        self.c.on_subscribe = self._on_subscribe
        self.subacks: list = []
        options: dict = {}
        if protocol == paho.MQTTv5:
            props = Properties(PacketTypes.CONNECT)
            if expiry is not None:
                props.SessionExpiryInterval = expiry
            if receive_maximum is not None:
                props.ReceiveMaximum = receive_maximum
            options = {"clean_start": clean, "properties": props}
        self.c.connect("127.0.0.1", broker.port, **options)
        self.c.loop_start()
        self.wait(lambda: self.connacks, "CONNACK")

    def _on_connect(self, client, userdata, flags, reason, props):
        with self.cond:
            self.connacks.append((flags.session_present, str(reason), _dump(props)))
            self.cond.notify_all()

    def _on_disconnect(self, client, userdata, flags, reason, props):
        with self.cond:
            self.disconnects.append((str(reason), getattr(reason, "value", None), _dump(props)))
            self.cond.notify_all()

    def _on_message(self, client, userdata, msg):
        with self.cond:
            self.messages.append(msg)
            self.cond.notify_all()

    def _on_subscribe(self, client, userdata, mid, reasons, props):
        with self.cond:
            self.subacks.append([(str(r), r.value) for r in reasons])
            self.cond.notify_all()

    def wait(self, predicate: Callable[[], object], what: str, timeout: float = WAIT_S) -> bool:
        with self.cond:
            return bool(self.cond.wait_for(predicate, timeout))

    def subscribe(self, topic: str, qos: int = 1) -> list:
        n, d = len(self.subacks), len(self.disconnects)
        self.c.subscribe(topic, qos=qos)
        self.wait(lambda: len(self.subacks) > n or len(self.disconnects) > d, "SUBACK")
        return self.subacks[-1] if len(self.subacks) > n else ["no SUBACK"]

    def publish(self, topic: str, payload, qos: int = 1, expiry: Optional[int] = None) -> None:
        props = None
        if expiry is not None:
            props = Properties(PacketTypes.PUBLISH)
            props.MessageExpiryInterval = expiry
        self.c.publish(topic, payload, qos=qos, properties=props).wait_for_publish(WAIT_S)

    def drop(self) -> None:
        """Close the socket without DISCONNECT, like a SIGKILLed process."""
        self.c.loop_stop()
        self.c.socket().close()

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


def probe_connack() -> None:
    """(i), (b): what CONNACK says to a v5 client asking for a day of session expiry."""
    with Ejabberd() as b:
        p = Peer(b, "ca", expiry=86400)
        print("connack, default listener:", p.connacks[0])
        p.close()
    with Ejabberd(settings={"listen": {"max_payload_size": 65536}}) as b:
        p = Peer(b, "cb", expiry=86400)
        print("connack, listener max_payload_size 65536:", p.connacks[0])
        p.close()
    with Ejabberd(settings={"modules": {"mod_mqtt": {"session_expiry": 86400}}}) as b:
        p = Peer(b, "cc", expiry=86400)
        print("connack, mod_mqtt session_expiry 86400:", p.connacks[0])
        p.close()


def probe_session() -> None:
    """A persistent session across a client drop, a broker stop/start and a broker SIGKILL."""
    with Ejabberd() as b:
        sub = Peer(b, "sess", expiry=300)
        sub.subscribe("probe/s")
        sub.drop()
        pub = Peer(b, "pub")
        pub.publish("probe/s", b"while-away")
        back = Peer(b, "sess", expiry=300, clean=False)
        back.wait(lambda: back.messages, "queued message", SETTLE_S * 2)
        print("client dropped, back:", back.connacks[0], "got", [m.payload for m in back.messages])
        back.close()
        pub.close()
        for how in ("stop", "kill"):
            sub = Peer(b, "sess2", expiry=300)
            sub.subscribe("probe/s2")
            sub.drop()
            getattr(b, how)()
            b.start()
            back = Peer(b, "sess2", expiry=300, clean=False)
            pub = Peer(b, "pub")
            pub.publish("probe/s2", b"after-restart")
            back.wait(lambda: back.messages, "message", SETTLE_S * 2)
            print(f"broker {how} + start:", back.connacks[0], "got", [m.payload for m in back.messages])
            back.close()
            pub.close()


def probe_share() -> None:
    """(d) SUBACK for a $share filter."""
    with Ejabberd() as b:
        p = Peer(b, "sh", expiry=300)
        print("SUBACK $share/g/probe/t:", p.subscribe("$share/g/probe/t", ), "DISCONNECT:", p.disconnects)
        p.c.loop_stop()
        q = Peer(b, "sh2", expiry=300)
        print("SUBACK probe/t:", q.subscribe("probe/t"))
        q.close()


def probe_takeover() -> None:
    """(e) What the older of two connections with one client id is told."""
    with Ejabberd() as b:
        first = Peer(b, "same", expiry=300)
        second = Peer(b, "same", expiry=300, clean=False)
        first.wait(lambda: first.disconnects, "DISCONNECT", 5)
        print("old connection:", first.disconnects, "new connection CONNACK:", second.connacks[0])
        first.c.loop_stop()
        second.close()


def probe_receive_maximum() -> None:
    """(f) A manual-ack client with ReceiveMaximum 10 and a 200-message burst."""
    limit, burst = 10, 200
    with Ejabberd() as b:
        sub = Peer(b, "rm", expiry=300, manual_ack=True, receive_maximum=limit)
        sub.subscribe("probe/rm")
        pub = Peer(b, "pub")
        infos = [pub.c.publish("probe/rm", str(i), qos=1) for i in range(burst)]
        for info in infos:
            info.wait_for_publish(WAIT_S)
        time.sleep(SETTLE_S)
        unacked = len(sub.messages)
        print(f"ReceiveMaximum {limit}, {burst} published, none acked: {unacked} delivered (in flight)")
        acked = 0
        deadline = time.monotonic() + WAIT_S
        while acked < burst and time.monotonic() < deadline:
            with sub.cond:
                pending = sub.messages[acked:]
            for m in pending:
                sub.c.ack(m.mid, m.qos)
            acked += len(pending)
            if not pending:
                time.sleep(0.05)
            if acked and acked % 50 < len(pending):
                print(f"  acked {acked}, delivered {len(sub.messages)}, in flight {len(sub.messages) - acked}")
        print(f"  after acking as they come: delivered {len(sub.messages)}, "
              f"distinct {len({m.payload for m in sub.messages})}")
        sub.close()
        pub.close()


def probe_expiry() -> None:
    """(g) Message expiry of a message queued for an offline session."""
    with Ejabberd() as b:
        sub = Peer(b, "ex", expiry=300)
        sub.subscribe("probe/ex")
        sub.drop()
        pub = Peer(b, "pub")
        # The first takes the session's single in-flight slot (written to the dead socket);
        # the rest wait in its queue.
        pub.publish("probe/ex", b"first-expires-in-1s", expiry=1)
        pub.publish("probe/ex", b"queued-expires-in-1s", expiry=1)
        pub.publish("probe/ex", b"queued-expires-in-60s", expiry=60)
        pub.publish("probe/ex", b"queued-no-expiry")
        time.sleep(3)
        back = Peer(b, "ex", expiry=300, clean=False)
        back.wait(lambda: len(back.messages) >= 4, "queued", SETTLE_S * 2)
        print("after 3 s offline:", [(m.payload, _dump(m.properties).get("MessageExpiryInterval"))
                                     for m in back.messages])
        back.close()
        pub.close()


def probe_v311() -> None:
    """(h) an MQTT 3.1.1 client: publish/receive QoS 1 and a clean_session=False session."""
    with Ejabberd() as b:
        c = paho.Client(CallbackAPIVersion.VERSION2, client_id="v3", protocol=paho.MQTTv311, clean_session=False)
        c.username_pw_set(b.username, b.password)
        got, connacks = [], []
        c.on_message = lambda cl, u, m: got.append(m.payload)
        c.on_connect = lambda cl, u, flags, rc, props: connacks.append((flags.session_present, str(rc)))
        c.connect("127.0.0.1", b.port)
        c.loop_start()
        time.sleep(0.5)
        c.subscribe("probe/v3", qos=1)
        time.sleep(0.5)
        c.publish("probe/v3", b"v3-self", qos=1).wait_for_publish(WAIT_S)
        time.sleep(0.5)
        c.disconnect()
        c.loop_stop()
        pub = Peer(b, "pub")
        pub.publish("probe/v3", b"while-away")
        c.connect("127.0.0.1", b.port)
        c.loop_start()
        time.sleep(SETTLE_S)
        print("3.1.1 clean_session=False:", connacks, "got", got)
        c.disconnect()
        c.loop_stop()
        pub.close()


PROBES = {name[len("probe_"):]: fn for name, fn in globals().items() if name.startswith("probe_")}


def main(names: list[str]) -> None:
    for name in names or PROBES:
        print(f"== {name}", flush=True)
        PROBES[name]()


if __name__ == "__main__":
    main(sys.argv[1:])
