#!/usr/bin/env python3
"""The daemon over `mqtt.transport: paho` and `native`, and the paho echo, side by side.

    .venv/bin/python benchmarks/bench_transport.py [--requests 10000] [--rounds 3] [--route load]

Each round, for each consumer in turn (the order alternates between rounds): a fresh private
mosquitto, the consumer started and online, then a `mosquitto_pub -l` burst at QoS 1 of
distinct JSON requests for the route; the consumer's CPU (utime + stime, all threads) from
just before the burst until its last reply arrives, per answer, and answers per second. The
daemon runs the example config with the cache off (the transport is what differs) and a clean
session. Prints one line per run and the medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import paho.mqtt.client as paho
import yaml
from paho.mqtt.enums import CallbackAPIVersion

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from daemon.config.reader import absolute_paths  # noqa: E402
from daemon.tools.bench.load import process_cpu_s, wait_online  # noqa: E402
from daemon.tools.broker import Broker, end_process  # noqa: E402

WAIT_S = 300.0
CONSUMERS = ("echo", "paho", "native")


def _requests(path: Path, route: dict, n: int) -> None:
    """n distinct requests: seeded noise, so no two share bytes (a sensor stream never repeats)."""
    size = int(np.prod(route["input"]["shape"]))
    rng = np.random.default_rng(17)
    with open(path, "w") as fh:
        for i in range(n):
            fh.write(json.dumps({"id": i, "data": np.round(rng.normal(size=size), 4).tolist()},
                                separators=(",", ":")) + "\n")


def _config(tmp: Path, transport: str, route: str) -> Path:
    raw = absolute_paths(yaml.safe_load((ROOT / "config.yaml").read_text()), ROOT)
    raw["cache"] = {**raw.get("cache", {}), "enabled": False, "dir": str(tmp / "cache")}
    raw["mqtt"] = {**raw["mqtt"], "client_id": "edge-inferd", "transport": transport, "session_expiry_s": 0,
                   "outbox": {"dir": str(tmp / "outbox")}}
    raw["routes"] = [r for r in raw["routes"] if r["name"] == route]
    path = tmp / f"config-{transport}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


class Collector:
    def __init__(self, port: int, topic: str):
        self.count = self.errors = 0
        self.done = threading.Condition()
        self.c = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
        self.c.on_message = self._on_message
        self.c.connect("127.0.0.1", port)
        self.c.subscribe(topic, qos=0)
        self.c.loop_start()

    def _on_message(self, client, userdata, msg) -> None:
        with self.done:
            self.count += 1
            self.errors += b'"error"' in msg.payload
            self.done.notify_all()

    def wait(self, n: int) -> bool:
        with self.done:
            return self.done.wait_for(lambda: self.count >= n, WAIT_S)

    def close(self) -> None:
        self.c.loop_stop()
        self.c.disconnect()


def _run(consumer: str, args: argparse.Namespace, tmp: Path, lines: Path, route: dict) -> dict:
    with Broker(tmp / f"broker-{consumer}") as broker:
        log = tmp / f"{consumer}.log"
        if consumer == "echo":
            cmd = [sys.executable, "-m", "daemon.tools.baselines", "echo", "--broker", broker.address,
                   "--route", args.route]
            status = "edge-inferd/echo/status"
        else:
            cmd = [sys.executable, "-m", "daemon", "run", "--config", str(_config(tmp, consumer, args.route)),
                   "--broker", broker.address]
            status = "edge-inferd/edge-inferd/status"
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            wait_online(broker.address, status, proc, log)
            collector = Collector(broker.port, route["publish"].replace("{1}", "+"))
            time.sleep(0.5)  # let the collector's SUBSCRIBE land (mosquitto_sub has no ack to wait on)
            cpu0, t0 = process_cpu_s(proc.pid), time.monotonic()
            with open(lines, "rb") as fh:
                subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(broker.port), "-q", "1", "-l",
                                "-t", route["subscribe"].replace("+", "b1")], stdin=fh, check=True, timeout=WAIT_S)
            complete = collector.wait(args.requests)
            cpu1, t1 = process_cpu_s(proc.pid), time.monotonic()
            collector.close()
        finally:
            end_process(proc)
    return {"consumer": consumer, "complete": complete, "answers": collector.count, "errors": collector.errors,
            "cpu_us": (cpu1 - cpu0) / max(1, collector.count) * 1e6, "rate": collector.count / (t1 - t0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--route", default="load")
    args = parser.parse_args()
    route = next(r for r in yaml.safe_load((ROOT / "config.yaml").read_text())["routes"] if r["name"] == args.route)
    results: dict[str, list[dict]] = {c: [] for c in CONSUMERS}
    with tempfile.TemporaryDirectory(prefix="bench-transport-") as tmp_name:
        tmp = Path(tmp_name)
        tmp.chmod(0o711)  # mosquitto may drop to its own user (PITFALLS: persistence in a 0700 dir)
        lines = tmp / "requests.txt"
        _requests(lines, route, args.requests)
        for k in range(args.rounds):
            order = CONSUMERS if k % 2 == 0 else tuple(reversed(CONSUMERS))
            for consumer in order:
                r = _run(consumer, args, tmp, lines, route)
                results[consumer].append(r)
                print(f"round {k + 1} {consumer:>6}: {r['cpu_us']:6.1f} us CPU/answer, {r['rate']:7.0f} answers/s, "
                      f"{r['answers']} answers ({r['errors']} errors){'' if r['complete'] else ' INCOMPLETE'}",
                      flush=True)
    print("medians:")
    for consumer, runs in results.items():
        print(f"  {consumer:>6}: {statistics.median(r['cpu_us'] for r in runs):6.1f} us CPU/answer, "
              f"{statistics.median(r['rate'] for r in runs):7.0f} answers/s")


if __name__ == "__main__":
    main()
