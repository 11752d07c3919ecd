"""Drain capacity against `workers.processes`: requests/s to answer a burst, per P.

For each P: a private mosquitto, `edge-inferd run` on config.yaml with the cache off and
`workers.processes: P`; once the node is `online`, N activity requests are published at
once (QoS 1) and the rate is N / (time from the first to the last reply).
Run: python benchmarks/bench_processes.py --processes 1 2 --requests 10000
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from daemon.tools.bench.phases import start_daemon  # noqa: E402
from daemon.tools.broker import Broker  # noqa: E402

TIMEOUT_S = 300.0


def _overrides(processes: int) -> dict:
    # Worker processes keep persistent sessions (their share waits for them across a restart).
    return {"cache": {"enabled": False}, "workers": {"processes": processes},
            "mqtt": {"session_expiry_s": 0 if processes == 1 else 3600}}


def _payloads(n: int) -> list[bytes]:
    with np.load(ROOT / "models/activity/test.npz") as data:
        x = data["x"]
    return [json.dumps({"id": i, "data": np.round(x[i % len(x)], 3).tolist()}).encode() for i in range(n)]


def measure(processes: int, payloads: list[bytes]) -> float:
    with tempfile.TemporaryDirectory() as tmp, Broker(Path(tmp) / "broker") as broker:
        cond, times, seen, errors = threading.Condition(), [], set(), []
        c = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)

        def on_message(client, userdata, msg):
            with cond:
                if (reply := json.loads(msg.payload))["id"] not in seen:
                    seen.add(reply["id"])
                    times.append(time.monotonic())
                    if "error" in reply:  # results are counted, not replies: an `overloaded` is no result
                        errors.append(reply["error"]["code"])
                cond.notify_all()
        c.on_message = on_message
        c.connect("127.0.0.1", broker.port)
        c.subscribe([("results/b/activity", 1)])
        c.loop_start()
        try:
            daemon = start_daemon(ROOT / "config.yaml", Path(tmp), "bench", _overrides(processes), broker.address,
                                  Path(tmp) / "daemon.log", pythonpath=ROOT)  # returns once the node is online
            try:
                for info in [c.publish("sensors/b/imu", p, qos=1) for p in payloads]:
                    info.wait_for_publish(TIMEOUT_S)
                with cond:
                    assert cond.wait_for(lambda: len(times) >= len(payloads), TIMEOUT_S), f"{len(times)} answered"
            finally:
                daemon.stop()
        finally:
            c.disconnect()
            c.loop_stop()
        assert not errors, f"{len(errors)} of {len(payloads)} answered with an error ({errors[0]}), not a result"
        return (len(times) - 1) / (times[-1] - times[0])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--requests", type=int, default=10000)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    payloads = _payloads(args.requests)
    for p in args.processes:
        rates = [measure(p, payloads) for _ in range(args.repeat)]
        print(json.dumps({"processes": p, "cpus": os.cpu_count(), "requests": args.requests,
                          "drain_req_per_s": [round(r) for r in rates]}), flush=True)


if __name__ == "__main__":
    main()
