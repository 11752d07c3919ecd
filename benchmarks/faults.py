#!/usr/bin/env python3
"""Fault runs too slow or too lossy for the suite; today one: the broker SIGKILLed mid-stream.

    .venv/bin/python benchmarks/faults.py broker-kill [--runs 3] [--down-s 3] [--rate 200] [--out f.json]

A private mosquitto (persistence on, `autosave_interval 1`: daemon/tools/broker.py), the real
daemon with its persistent session, and two persistent paho v5 clients of their own
(clean_start False, a session expiry): a QoS 1 publisher paced at `--rate` and a
collector of the replies. Mid-stream the broker is SIGKILLed, stays down `--down-s`,
and is restarted on the same port with the same persistence directory; the publisher
keeps publishing (paho holds QoS 1 messages while it is disconnected). Then every
request id is checked for a reply: never answered, answered twice or more.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from daemon.tools.bench.load import json_line  # noqa: E402
from daemon.tools.bench.phases import start_daemon  # noqa: E402
from daemon.tools.broker import Broker  # noqa: E402
from daemon.transport.mqtt import disable_nagle, stop_loop  # noqa: E402

CLIENT_ID = "faults"
REQUEST_TOPIC = "sensors/f1/imu"
REPLY_TOPIC = "results/f1/activity"
SESSION_EXPIRY_S = 3600
RECONNECT_S = 1  # the clients' retry delay, like the daemon's reconnect_min_s in this run
BEFORE_KILL_S = 3.0  # the stream runs this long before the kill...
AFTER_RESTART_S = 3.0  # ...and this long after the restart
SETTLE_S = 15.0  # then replies are awaited until none came for this long
_POLL_S = 0.05
# The daemon (`edge-inferd run` from this checkout): persistent session, cache off, 1 s reconnects.
DAEMON_OVERRIDES = {"cache": {"enabled": False},
                    "mqtt": {"session_expiry_s": 86400, "reconnect_min_s": RECONNECT_S, "reconnect_max_s": RECONNECT_S}}


class PersistentClient:
    """A paho v5 client whose session the broker keeps (and saves) across its own restarts."""

    def __init__(self, address: str, client_id: str):
        self.replies: Counter = Counter()
        self._lock = threading.Lock()
        self.c = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=paho.MQTTv5)
        self.c.max_inflight_messages_set(1000)
        self.c.max_queued_messages_set(0)  # no limit: what is published while the broker is away waits
        self.c.reconnect_delay_set(RECONNECT_S, RECONNECT_S)
        self.c.on_message = self._on_message
        self.c.on_connect = lambda client, *a: disable_nagle(client.socket())
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = SESSION_EXPIRY_S
        host, port = address.rsplit(":", 1)
        self.c.connect(host, int(port), clean_start=False, properties=props)
        self.c.loop_start()

    def _on_message(self, client, userdata, msg) -> None:
        try:
            request_id = json.loads(msg.payload).get("id")
        except (ValueError, AttributeError):
            return
        with self._lock:
            self.replies[request_id] += 1

    def subscribe(self, topic: str) -> None:
        done = threading.Event()
        self.c.on_subscribe = lambda *a: done.set()
        self.c.subscribe(topic, qos=1)
        if not done.wait(30):
            raise SystemExit(f"subscription to {topic} not acknowledged")

    def answered(self) -> int:
        with self._lock:
            return len(self.replies)

    def close(self) -> None:
        self.c.disconnect()
        stop_loop(self.c)


def payloads(n: int) -> list[bytes]:
    with np.load(ROOT / "models/activity/test.npz", allow_pickle=False) as data:
        x = data["x"]
    rows = [json.dumps(np.round(r, 3).tolist()).encode() for r in x]
    return [json_line(i, rows[i % len(rows)]) for i in range(n)]


def stream(publisher: PersistentClient, lines: list[bytes], rate: float) -> None:
    """QoS 1 publishes paced at `rate`, whether or not the broker is up."""
    start = time.perf_counter()
    for k, line in enumerate(lines):
        delay = start + k / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        publisher.c.publish(REQUEST_TOPIC, line, qos=1)


def settle(collector: PersistentClient, n: int) -> None:
    """Until every id is answered, or no new reply came for SETTLE_S."""
    seen, last_change = -1, time.monotonic()
    while collector.answered() < n and time.monotonic() - last_change < SETTLE_S:
        if collector.answered() != seen:
            seen, last_change = collector.answered(), time.monotonic()
        time.sleep(_POLL_S)


def broker_kill(workdir: Path, rate: float, down_s: float) -> dict:
    """One run: stream, SIGKILL the broker, `down_s` later restart it; count per request id."""
    broker = Broker(workdir / "broker").start()
    clients: list[PersistentClient] = []
    daemon = None
    try:
        daemon = start_daemon(ROOT / "config.yaml", workdir, CLIENT_ID, DAEMON_OVERRIDES, broker.address,
                              workdir / "daemon.log", pythonpath=ROOT)
        clients.append(PersistentClient(broker.address, f"{CLIENT_ID}-collector"))
        clients[0].subscribe(REPLY_TOPIC)
        clients.append(PersistentClient(broker.address, f"{CLIENT_ID}-publisher"))
        lines = payloads(int(rate * (BEFORE_KILL_S + down_s + AFTER_RESTART_S)))
        killer = threading.Timer(BEFORE_KILL_S, lambda: (broker.kill(), time.sleep(down_s), broker.start()))
        killer.start()
        stream(clients[1], lines, rate)
        killer.join()
        settle(clients[0], len(lines))
        replies = clients[0].replies
        lost = [i for i in range(len(lines)) if i not in replies]
        return {"sent": len(lines), "answered": len(lines) - len(lost), "lost": len(lost),
                "lost_ids": f"{lost[0]}..{lost[-1]}" if lost else "",
                "duplicates": sum(c - 1 for c in replies.values()),
                "killed_after": int(rate * BEFORE_KILL_S)}
    finally:
        for client in clients:
            client.close()
        if daemon is not None:
            daemon.stop()
        broker.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("fault", choices=["broker-kill"])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--down-s", type=float, default=3.0, help="how long the broker stays down")
    parser.add_argument("--rate", type=float, default=200.0, help="requests per second")
    parser.add_argument("--out", type=Path, help="write the runs as JSON here")
    args = parser.parse_args()
    runs = []
    for k in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="edge-inferd-faults-") as tmp:
            runs.append(broker_kill(Path(tmp), args.rate, args.down_s))
        print(f"run {k + 1}: " + ", ".join(f"{key} {value}" for key, value in runs[-1].items()), flush=True)
    if args.out:
        args.out.write_text(json.dumps(runs, indent=1))
    return 0 if all(run["lost"] == 0 for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
