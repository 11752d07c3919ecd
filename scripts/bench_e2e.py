#!/usr/bin/env python3
"""End-to-end over a real mosquitto: edge-inferd vs the naive inline script, side by side.

    .venv/bin/python scripts/bench_e2e.py [--requests 2000] [--window 32]

For each server in turn (same broker, same model, same requests): round trip at one
request outstanding (latency), then throughput with `--window` requests outstanding.
Ratios are what to compare: the machines are shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from daemon.broker import Broker, end_process  # noqa: E402
from tests.integration.conftest import Client, write_config  # noqa: E402

LATENCY_REQUESTS = 300


def _payloads(n: int) -> list[bytes]:
    with np.load(ROOT / "models/activity/test.npz") as data:
        x = data["x"]
    return [json.dumps({"id": i, "data": x[i % len(x)].tolist()}).encode() for i in range(n)]


def measure(client: Client, payloads: list[bytes], window: int) -> tuple[float, float, float]:
    """(p50 ms, p99 ms, requests/s) for payloads sent with `window` outstanding."""
    reply = "results/bench/activity"
    base = len(client.on(reply))
    sent_at = []
    start = time.perf_counter()
    for i, payload in enumerate(payloads):
        if i >= window:
            client.wait_count(reply, base + i - window + 1)
        sent_at.append(time.perf_counter())
        client.c.publish("sensors/bench/imu", payload, qos=1)
    msgs = client.wait_count(reply, base + len(payloads))[base:]
    elapsed = time.perf_counter() - start
    arrived = {json.loads(m.payload)["id"]: m.timestamp for m in msgs}
    rtt = np.array([(arrived[i] - sent_at[i]) * 1000 for i in range(len(payloads)) if i in arrived])
    return float(np.percentile(rtt, 50)), float(np.percentile(rtt, 99)), len(payloads) / elapsed


def run_server(name: str, cmd: list[str], status: str, broker: Broker, args) -> dict:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    client = Client(broker)
    try:
        client.subscribe(status)
        client.wait_payload(status, b"online")
        client.subscribe("results/bench/activity")
        measure(client, _payloads(50), 1)  # warm-up
        p50, p99, _ = measure(client, _payloads(LATENCY_REQUESTS), 1)
        _, _, rate = measure(client, _payloads(args.requests), args.window)
        print(f"  {name:<12} round trip p50 {p50:6.2f} ms  p99 {p99:6.2f} ms   "
              f"throughput {rate:7.0f} req/s (window {args.window})", flush=True)
        return {"p50_ms": p50, "p99_ms": p99, "rps": rate}
    finally:
        client.close()
        end_process(proc)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--window", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2, help="daemon worker threads (default 2)")
    args = parser.parse_args()
    with Broker() as broker, tempfile.TemporaryDirectory() as tmp:
        config = write_config(Path(tmp), cache={"enabled": False}, workers={"max": args.workers})
        print(f"activity model, {args.requests} JSON requests, mosquitto on {broker.address}")
        cmd = [sys.executable, "-m", "daemon", "run", "--config", str(config), "--broker", broker.address]
        daemon = run_server(f"edge-inferd/{args.workers}w", cmd, "edge-inferd/edge-inferd/status", broker, args)
        naive = run_server("naive", [sys.executable, "scripts/naive_baseline.py", broker.address],
                           "edge-inferd/naive/status", broker, args)
    print(f"  ratio daemon/naive: throughput {daemon['rps'] / naive['rps']:.2f}x, "
          f"p50 round trip {daemon['p50_ms'] / naive['p50_ms']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
