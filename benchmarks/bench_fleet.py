#!/usr/bin/env python3
"""Fleet delivery's figures on one node (docs/fleet.md, "Figures"):

    .venv/bin/python benchmarks/bench_fleet.py [--rounds 3] [--rate 200]

Per round, a fresh node serving the bundled activity model (managed, config.yaml's defaults for
the fleet but a canary of 0 s and 0 answers, so "active" is the delivery itself) on a private
mosquitto, a release server on loopback, and an open-loop client sending distinct requests at
`--rate` per second throughout. Reported per round:
- desired -> active: from the desired document's PUBACK to the reported `active`;
- the gate's CPU (the child process's user + system seconds, as the node reports it);
- serving p99 (client round trip) in the 5 s before the desired document and from it to
  `active` plus 2 s (the swap inside), and results counted against requests sent.
Each round's release alternates between another build of the model and the bundled one, so
every round swaps a different file in.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

import numpy as np
import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from daemon.fleet.release import minisign  # noqa: E402
from daemon.fleet.controller.publish import make_release  # noqa: E402
from daemon.tools.broker import Broker, end_process  # noqa: E402
from daemon.tools.demo_fleet import ACTIVITY, SECOND_BUILD, node_config  # noqa: E402
from daemon.tools.release_server import ReleaseServer  # noqa: E402

NODE = "gw1"
BEFORE_S = 5.0
AFTER_S = 2.0
SETTLE_S = 2.0
WAIT_S = 120.0


class OpenLoop:
    """Distinct requests at a fixed rate, whatever the replies do; round trips by id."""

    def __init__(self, port: int, rate: float):
        with np.load(ACTIVITY / "test.npz") as data:
            self._x = data["x"]
        self.sent: dict[int, float] = {}
        self.rtt: dict[int, tuple[float, float]] = {}  # id -> (sent at, round trip s)
        self.errors: dict[int, str] = {}  # id -> error code
        self.reported: list[dict] = []
        self._lock = threading.Lock()
        self._c = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
        self._c.on_message = self._on_message
        self._c.connect("127.0.0.1", port)
        self._c.subscribe([(f"results/{NODE}/+/activity", 1), (f"edge-inferd/{NODE}/fleet/reported", 1)])
        self._c.loop_start()
        self._rate, self._stop = rate, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        """Once the node serves (its first report): requests sent before it subscribed would be lost."""
        self.wait_state("idle", None)
        self._thread.start()

    def _run(self) -> None:
        n, start = 0, time.monotonic()
        while not self._stop.is_set():
            due = start + n / self._rate
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # open loop: the schedule, not the replies, sets the pace
            data = (self._x[n % len(self._x)] + np.float32(n * 1e-6)).round(6).tolist()  # distinct requests
            with self._lock:
                self.sent[n] = time.monotonic()
            self._c.publish(f"sensors/{NODE}/wrist/imu", json.dumps({"id": n, "data": data}), qos=1)
            n += 1

    def _on_message(self, client, userdata, msg) -> None:
        now = time.monotonic()
        body = json.loads(msg.payload)
        if msg.topic.endswith("/fleet/reported"):
            with self._lock:
                self.reported.append((now, body))
            return
        with self._lock:
            sent = self.sent.get(body.get("id"))
            if sent is not None and "error" in body:
                self.errors[body["id"]] = body["error"]["code"]
            elif sent is not None:
                self.rtt[body["id"]] = (sent, now - sent)

    def wait_state(self, state: str, serial: Optional[int]) -> float:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            with self._lock:
                for at, doc in self.reported:
                    entry = doc["models"]["activity"]
                    if entry["state"] == state and entry["serial"] == serial:
                        return at
            time.sleep(0.01)  # a benchmark's poll: what it measures is stamped on arrival
        raise RuntimeError(f"no {state} serial {serial} within {WAIT_S:g} s: {self.reported[-1:]}")

    def window(self, start: float, end: float) -> dict:
        with self._lock:
            sent = [i for i, t in self.sent.items() if start <= t < end]
            trips = [self.rtt[i][1] for i in sent if i in self.rtt]
            errors = sorted({self.errors[i] for i in sent if i in self.errors})
        p = np.percentile(trips, [50, 99]) * 1000 if trips else [float("nan")] * 2
        return {"sent": len(sent), "results": len(trips), "errors": errors, "p50_ms": round(float(p[0]), 2),
                "p99_ms": round(float(p[1]), 2)}

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        time.sleep(1.0)  # the last replies
        self._c.disconnect()
        self._c.loop_stop()


def one_round(index: int, rate: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp_name, Broker() as broker:
        tmp = Path(tmp_name)
        key = minisign.generate()
        source = SECOND_BUILD if index % 2 == 0 else ACTIVITY
        with ReleaseServer(tmp / "site") as site:
            if source == ACTIVITY:  # the configured file is this one: start from the other build
                make_release(site.root / "activity/1", "activity", "1.0.0", 1, SECOND_BUILD / "model.tflite",
                             SECOND_BUILD / "labels.txt", key)
            make_release(site.root / "activity/2", "activity", "1.1.0", 2, source / "model.tflite",
                         source / "labels.txt", key)
            config = node_config(tmp / NODE, NODE, key.public_key.line,
                                 canary={"duration_s": 0, "min_answers": 0})
            log = open(tmp / "daemon.log", "wb")
            daemon = subprocess.Popen([sys.executable, "-m", "daemon", "run", "--config", str(config), "--broker",
                                       broker.address], stdout=log, stderr=subprocess.STDOUT)
            client = OpenLoop(broker.port, rate)
            try:
                client.start()
                return _measure(client, site, source == ACTIVITY)
            finally:
                client.close()
                end_process(daemon)


def _measure(client: OpenLoop, site: ReleaseServer, first_the_other: bool) -> dict:
    rev = 1
    if first_the_other:
        _desire(client, rev, site.url("activity/1/"), 1)
        client.wait_state("active", 1)
        rev += 1
    time.sleep(BEFORE_S)  # the window before: steady serving
    desired_at = _desire(client, rev, site.url("activity/2/"), 2)
    active_at = client.wait_state("active", 2)
    time.sleep(AFTER_S + SETTLE_S)  # the window after, then its last replies
    gate = next(doc for _, doc in reversed(client.reported) if doc["models"]["activity"]["serial"] == 2)
    return {"desired_to_active_s": round(active_at - desired_at, 3),
            "gate_cpu_s": gate["models"]["activity"]["gate"].get("cpu_s"),
            "before": client.window(desired_at - BEFORE_S, desired_at),
            "during_swap": client.window(desired_at, active_at + AFTER_S)}


def _desire(client: OpenLoop, rev: int, url: str, serial: int) -> float:
    info = client._c.publish(f"edge-inferd/fleet/desired/node/{NODE}",
                             json.dumps({"rev": rev, "models": {"activity": {"url": url, "serial": serial}}}),
                             qos=1, retain=True)
    info.wait_for_publish(WAIT_S)
    return time.monotonic()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="rounds (each a fresh broker and node)")
    parser.add_argument("--rate", type=float, default=200.0, help="requests per second, open loop")
    args = parser.parse_args()
    for i in range(args.rounds):
        print(json.dumps({"round": i + 1, **one_round(i, args.rate)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
