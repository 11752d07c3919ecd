"""What ejabberd 23.01's mod_mqtt guarantees, probed with paho and with the real daemon.

A probe, not a test: it prints what it saw, one `probe: result` line each, and asserts
nothing. Each probe starts its own private ejabberd (tests/integration/ejabberd.py).
Run: python tools/dev/probe_ejabberd.py [probe ...]   (no argument: all of them)
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional

import paho.mqtt.client as paho
import yaml
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import numpy as np  # noqa: E402
from daemon.config.reader import absolute_paths  # noqa: E402
from daemon.tools.broker import end_process  # noqa: E402
from tests.integration.ejabberd import Ejabberd  # noqa: E402

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
    with Ejabberd(settings={"listen": {"max_payload_size": 1024}}) as b:
        p = Peer(b, "cb", expiry=86400)
        print("connack, listener max_payload_size 1024:", p.connacks[0])
        p.c.publish("probe/big", b"x" * 2000, qos=1)
        p.wait(lambda: p.disconnects, "DISCONNECT", 5)
        print("  a 2,000-byte PUBLISH to it:", p.disconnects)
        p.c.loop_stop()
    with Ejabberd() as b:
        small = paho.Client(CallbackAPIVersion.VERSION2, client_id="small", protocol=paho.MQTTv5)
        small.username_pw_set(b.username, b.password)
        got = []
        small.on_message = lambda c, u, m: got.append(len(m.payload))
        props = Properties(PacketTypes.CONNECT)
        props.MaximumPacketSize = 200
        small.connect("127.0.0.1", b.port, properties=props)
        small.loop_start()
        time.sleep(0.5)
        small.subscribe("probe/big", qos=1)
        time.sleep(0.5)
        pub = Peer(b, "pub")
        pub.publish("probe/big", b"x" * 2000)
        time.sleep(SETTLE_S)
        print("client announcing MaximumPacketSize 200 was sent payloads of", got, "bytes")
        small.loop_stop()
        pub.close()
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
            back.wait(lambda b=back: b.messages, "message", SETTLE_S * 2)
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


def probe_queue_full() -> None:
    """An offline session past mod_mqtt's max_queue (5,000 by default)."""
    for n in (5000, 5002):
        with Ejabberd() as b:
            sub = Peer(b, "qf", expiry=300)
            sub.subscribe("probe/qf")
            sub.drop()
            time.sleep(0.5)
            pub = Peer(b, "pub")
            infos = [pub.c.publish("probe/qf", str(i), qos=1) for i in range(n)]
            for info in infos:
                info.wait_for_publish(WAIT_S)
            back = Peer(b, "qf", expiry=300, clean=False)
            back.wait(lambda bk=back, k=n: len(bk.messages) >= k, "queued", 10)
            print(f"{n} queued while offline: back with {back.connacks[0][:2]}, got {len(back.messages)}")
            back.close()
            pub.close()


# ---- with the real daemon ----------------------------------------------------------------

STATUS = "edge-inferd/edge-inferd/status"


def _requests(first: int, n: int) -> list[bytes]:
    with np.load(ROOT / "models/activity/test.npz") as data:
        x = data["x"]
    return [json.dumps({"id": i, "data": np.round(x[i % len(x)], 3).tolist()}).encode()
            for i in range(first, first + n)]


def _config(workdir: Path, broker: Ejabberd, **mqtt) -> Path:
    raw = absolute_paths(yaml.safe_load((ROOT / "config.yaml").read_text()), ROOT)
    raw["cache"] = {**(raw.get("cache") or {}), "dir": str(workdir / "cache"), "enabled": False}
    raw["mqtt"] = {**(raw.get("mqtt") or {}), "client_id": "edge-inferd", "username": broker.username,
                   "password": broker.password, "outbox": {"dir": str(workdir / "outbox")}, **mqtt}
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


class Daemon:
    def __init__(self, config: Path, broker: Ejabberd, log: Path):
        self.log_path = log
        out = open(log, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "daemon", "run", "--config", str(config),
                                      "--broker", broker.address], stdout=out, stderr=subprocess.STDOUT,
                                     cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        out.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        end_process(self.proc, sig, WAIT_S)


def _interesting(log: str, limit: int = 12) -> list[str]:
    keep = re.compile(r"WARNING|ERROR|refus|taken|client id|share|reconnect|dropped|disconnect|connected to",
                      re.IGNORECASE)
    lines = [line[:240] for line in log.splitlines() if keep.search(line) and "mqtt: connected to" not in line]
    connects = sum("mqtt: connected to" in line for line in log.splitlines())
    return [f"{connects} x connected"] + (lines if len(lines) <= limit else lines[:3] + ["..."] + lines[3 - limit:])


@contextmanager
def _setup(broker_settings: Optional[dict] = None, **mqtt) -> Iterator[tuple]:
    with tempfile.TemporaryDirectory(prefix="probe-ejabberd-") as tmp:
        work = Path(tmp)
        with Ejabberd(work / "broker", settings=broker_settings) as broker:
            config = _config(work, broker, **mqtt)
            client = Peer(broker, "tester", expiry=300)
            client.subscribe(STATUS)
            client.subscribe("results/#")
            client.subscribe("replies/#")
            daemon = Daemon(config, broker, work / "daemon.log")
            try:
                yield broker, client, daemon, config, work
            finally:
                daemon.stop()
                client.c.loop_stop()


def _wait_online(client: Peer, count: int = 1) -> bool:
    return client.wait(lambda: sum(m.topic == STATUS and m.payload == b"online"
                                   for m in client.messages) >= count, "online")


def _answered(client: Peer, topic_prefix: str = "results/") -> set:
    with client.cond:
        return {json.loads(m.payload).get("id") for m in client.messages if m.topic.startswith(topic_prefix)}


def _wait_answered(client: Peer, ids: set, timeout: float = WAIT_S) -> set:
    client.wait(lambda: ids <= _answered(client), "answers", timeout)
    return ids & _answered(client)


def probe_daemon_reqresp() -> None:
    """(a) v5 ResponseTopic + CorrelationData through ejabberd."""
    with _setup() as (broker, client, daemon, config, work):
        print("online:", _wait_online(client))
        props = Properties(PacketTypes.PUBLISH)
        props.ResponseTopic = "replies/me"
        props.CorrelationData = b"req-42"
        client.c.publish("sensors/w9/imu", _requests(3, 1)[0], qos=1, properties=props).wait_for_publish(WAIT_S)
        client.wait(lambda: any(m.topic == "replies/me" for m in client.messages), "reply")
        got = [(m.topic, m.properties.CorrelationData, json.loads(m.payload).get("id"), m.qos)
               for m in client.messages if m.topic.startswith(("replies/", "results/"))]
        print("reply (topic, CorrelationData, id, qos):", got)


def probe_daemon_sigkill() -> None:
    """(b) requests published while the daemon is SIGKILLed are answered when it is back."""
    with _setup() as (broker, client, daemon, config, work):
        _wait_online(client)
        for p in _requests(0, 5):
            client.publish("sensors/a/imu", p)
        print("before kill, answered:", sorted(_wait_answered(client, set(range(5)))))
        daemon.stop(signal.SIGKILL)
        for p in _requests(100, 20):
            client.publish("sensors/a/imu", p)
        time.sleep(2)
        daemon.proc = Daemon(config, broker, work / "daemon.log").proc
        got = _wait_answered(client, set(range(100, 120)))
        print(f"published while killed: 20, answered after restart: {len(got)}")
        print("daemon log:", _interesting(daemon.log(), 6))
    # The daemon asks for mqtt.session_expiry_s (86400) and is granted mod_mqtt's session_expiry
    # (5 minutes unless set). Shortened here to 5 s to show what happens past it.
    with _setup(broker_settings={"modules": {"mod_mqtt": {"session_expiry": 5}}}) as (broker, client, daemon,
                                                                                      config, work):
        _wait_online(client)
        daemon.stop(signal.SIGKILL)
        time.sleep(8)
        for p in _requests(200, 20):
            client.publish("sensors/a/imu", p)
        daemon.proc = Daemon(config, broker, work / "daemon.log").proc
        _wait_online(client, 2)
        got = _wait_answered(client, set(range(200, 220)), 5)
        print(f"session_expiry 5 s, daemon away 8 s, then 20 published before it returns: {len(got)} answered")


BACKLOG = 3000  # requests; under mod_mqtt's max_queue (5,000 per session)


def _outage(how: str) -> None:
    with _setup() as (broker, client, daemon, config, work):
        _wait_online(client)
        ids = set(range(BACKLOG))
        infos = [client.c.publish("sensors/a/imu", p, qos=1) for p in _requests(0, BACKLOG)]
        for info in infos:
            info.wait_for_publish(WAIT_S)  # every request PUBACKed by the broker
        before = len(_answered(client))  # the rest wait in the daemon's session at the broker
        getattr(broker, how)()
        client.c.loop_stop()
        t0 = time.monotonic()
        broker.start()
        client2 = Peer(broker, "tester2", expiry=300)
        client2.subscribe(STATUS)
        client2.subscribe("results/#")
        online = _wait_online(client2)
        back_s = time.monotonic() - t0
        time.sleep(3)
        after = _answered(client2)
        print(f"broker {how}: {BACKLOG} requests acked by the broker, {before} answered before; daemon back online {online} "
              f"after {back_s:.1f}s; answered after: {len(after)}; never answered: "
              f"{len(ids - _answered(client) - after)}")
        for p in _requests(1000, 10):
            client2.publish("sensors/a/imu", p)
        print("  10 new requests after restart answered:", len(_wait_answered(client2, set(range(1000, 1010)))))
        print("  daemon log:", _interesting(daemon.log(), 6))
        client2.c.loop_stop()


def probe_daemon_broker_restart() -> None:
    """(c) broker SIGTERM restart and SIGKILL with the daemon running."""
    _outage("stop")
    _outage("kill")


def probe_daemon_share() -> None:
    """(d) mqtt.share_group against ejabberd."""
    with _setup(share_group="g") as (broker, client, daemon, config, work):
        online = _wait_online(client)
        time.sleep(5)
        print("online:", online, "; daemon log:", _interesting(daemon.log(), 8))


def probe_daemon_takeover() -> None:
    """(e) a second client with the daemon's client id; then two daemons with one id."""
    with _setup() as (broker, client, daemon, config, work):
        _wait_online(client)
        thief = Peer(broker, "edge-inferd", expiry=300, clean=False)
        time.sleep(5)
        print("after one takeover by a paho client, daemon log:", _interesting(daemon.log(), 6))
        thief.c.loop_stop()
        second = Daemon(config, broker, work / "daemon2.log")
        time.sleep(20)
        print("two daemons, first log:", _interesting(daemon.log(), 6))
        print("two daemons, second log:", _interesting(second.log(), 6))
        second.stop()


def probe_daemon_v311() -> None:
    """(h) mqtt.protocol 3.1.1 through ejabberd (requests sent by a 3.1.1 client)."""
    with _setup(protocol="3.1.1") as (broker, client, daemon, config, work):
        online = _wait_online(client)
        v3 = paho.Client(CallbackAPIVersion.VERSION2, client_id="v3", protocol=paho.MQTTv311)
        v3.username_pw_set(broker.username, broker.password)
        v3.connect("127.0.0.1", broker.port)
        v3.loop_start()
        for p in _requests(0, 5):
            v3.publish("sensors/v3/imu", p, qos=1).wait_for_publish(WAIT_S)
        got = _wait_answered(client, set(range(5)))
        print("online:", online, "answered:", sorted(got))
        daemon.stop(signal.SIGKILL)
        for p in _requests(50, 5):
            v3.publish("sensors/v3/imu", p, qos=1).wait_for_publish(WAIT_S)
        daemon.proc = Daemon(config, broker, work / "daemon.log").proc
        print("3.1.1 clean_session=False across SIGKILL, answered:",
              sorted(_wait_answered(client, set(range(50, 55)))))
        v3.loop_stop()


def probe_daemon_burst() -> None:
    """(f) with the daemon: how fast a 200-request burst is answered (ejabberd has one message in flight)."""
    with _setup() as (broker, client, daemon, config, work):
        _wait_online(client)
        t0 = time.monotonic()
        infos = [client.c.publish("sensors/a/imu", p, qos=1) for p in _requests(0, 200)]
        for info in infos:
            info.wait_for_publish(WAIT_S)
        got = _wait_answered(client, set(range(200)), 120)
        print(f"200-request burst: {len(got)} answered in {time.monotonic() - t0:.1f}s")


PROBES = {name[len("probe_"):]: fn for name, fn in globals().items() if name.startswith("probe_")}


def main(names: list[str]) -> None:
    for name in names or PROBES:
        print(f"== {name}", flush=True)
        PROBES[name]()


if __name__ == "__main__":
    main(sys.argv[1:])
