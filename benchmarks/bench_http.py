#!/usr/bin/env python3
"""The HTTP listener's figures (docs/http.md, "Figures"):

    .venv/bin/python benchmarks/bench_http.py [--rounds 3] [--duration 8] [--warmup 2] \
        [--rate 1000] [--connections 16] [--json FILE]

One private mosquitto, one daemon on config.yaml as shipped (only `http.port` added; its own cache
dir and client id, its persistent session ended at exit) and one echo server, all for the whole run.
Each round measures, one after the other, the same open-loop load of distinct `activity` rows:
- `http`: the daemon's `POST /v2/models/activity/infer`, one row per request, `--rate` requests/s
  over `--connections` keep-alive connections (benchmarks/http_load.py: a raw-socket
  client), each a thread with a fixed schedule (request k due at start + k / rate; connection c
  sends every connections-th k): a request sent late because its connection still waited is timed
  from when it was due, so a stall is not hidden (no coordinated omission); `late p99`: how late
  they went;
- `mqtt`: the same rows at the same rate from one paho client (its defaults, and TCP_NODELAY as
  http.client sets) to sensors/bench/imu, replies read on the route's publish topic;
- `echo`: a bare stdlib ThreadingHTTPServer in its own process (TCP_NODELAY and buffered writes,
  as the daemon's listener) answering each POST, once its body is read, with a fixed small v2 body.
Latency = due -> full reply, over results (HTTP 200 with outputs, or an MQTT reply without an
error; cached ones are counted apart as `hits`); errors by status / code; `lost`: no answer within
REPLY_TIMEOUT_S. CPU per result = a process's utime+stime (all threads, /proc) from the first
measured request due to the last measured answer, over results: the server's (the daemon's whole
process), the broker's for mqtt, and this bench's own (`client`: it shares the cores). `--warmup`
seconds of the same load run before each measurement, not counted. Every request of the run is
distinct (daemon/tools/bench/workload.py), so the daemon's cache never hits.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.http_load import (HOST, REPLY_TIMEOUT_S, EchoHandler, EchoServer, Schedule,  # noqa: E402
                                    http_load, wait_ready)
from daemon.tools.bench.load import process_cpu_s  # noqa: E402
from daemon.tools.bench.phases import start_daemon  # noqa: E402
from daemon.tools.bench.workload import DEVICE, build_workload  # noqa: E402
from daemon.tools.broker import Broker, end_process, free_port  # noqa: E402

ROUTE = "activity"
TARGETS = ("http", "mqtt", "echo")
POLL_S = 0.05  # the MQTT sender's wait for the last replies: they are stamped on arrival, not polled


class MqttLoad:
    """One paho client (its defaults: MQTT 3.1.1) for the whole run; replies stamped as they arrive.
    TCP_NODELAY on its socket, as http.client sets on its own (paho leaves Nagle on: docs/performance.md)."""

    def __init__(self, broker_port: int, workload):
        self.workload, self.plan = workload, None
        self.client = paho.Client(CallbackAPIVersion.VERSION2)
        self.client.on_message = self._on_message
        self.client.on_connect = lambda c, *_: c.socket().setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.client.connect(HOST, broker_port)
        self.client.subscribe(workload.reply_topic, qos=1)
        self.client.loop_start()

    def _on_message(self, client, userdata, msg) -> None:
        done, body = time.perf_counter(), json.loads(msg.payload)
        sample = self.plan.samples.get(body.get("id")) if self.plan else None
        if sample is not None and sample[2] is None:
            kind = body["error"].get("code", "error") if "error" in body else "hit" if body.get("cached") else "result"
            sample[2:] = [done, kind]

    def run(self, plan: Schedule) -> threading.Thread:
        self.plan = plan

        def send() -> None:
            for k in range(plan.n):
                i = plan.wait(k)
                self.client.publish(self.workload.request_topic, self.workload.line(i), qos=1)
            deadline = time.perf_counter() + REPLY_TIMEOUT_S  # then the unanswered count as lost
            while any(s[2] is None for s in list(plan.samples.values())) and time.perf_counter() < deadline:
                time.sleep(POLL_S)

        thread = threading.Thread(target=send, daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def measure(start_load, plan: Schedule, pids: dict[str, int]) -> dict:
    """Run the load; CPU of `pids` from the first measured request due to the end of the load."""
    waiter = start_load(plan)
    time.sleep(max(0.0, plan.window_start - time.perf_counter()))
    cpu0 = {name: process_cpu_s(pid) for name, pid in pids.items()}
    waiter.join()
    cpu = {name: process_cpu_s(pid) - cpu0[name] for name, pid in pids.items()}
    return summarize(plan.measured(), cpu)


def summarize(samples: list[list], cpu: dict[str, float]) -> dict:
    kinds = Counter(s[3] for s in samples)
    ms = np.array([(s[2] - s[0]) * 1e3 for s in samples if s[3] == "result"])
    late = np.array([(s[1] - s[0]) * 1e3 for s in samples])
    results = len(ms)
    out = {"sent": len(samples), "results": results, "hits": kinds.pop("hit", 0), "lost": kinds.pop("lost", 0),
           "errors": {k: v for k, v in kinds.items() if k != "result"}}
    if results:
        p50, p99 = np.percentile(ms, [50, 99])
        span = max(s[2] for s in samples if s[3] == "result") - samples[0][0]
        out.update(p50_ms=round(float(p50), 3), p99_ms=round(float(p99), 3), max_ms=round(float(ms.max()), 1),
                   results_per_s=round(results / span, 1))
    out["send_late_p99_ms"] = round(float(np.percentile(late, 99)), 3) if len(late) else None
    for name, seconds in cpu.items():  # cpu_us: the server's; broker_: mosquitto's (mqtt); client_: ours
        out[name] = round(seconds / max(results, 1) * 1e6, 1)
    return out


def ratios(row: dict) -> dict:
    """daemon-http against echo and against daemon-mqtt, per figure (above 1: http costs more)."""
    out = {}
    for ref in ("echo", "mqtt"):
        for key in ("p50_ms", "p99_ms", "cpu_us"):
            a, b = row["http"].get(key), row[ref].get(key)
            out[f"http/{ref} {key}"] = round(a / b, 2) if a and b else None
    return out


def median_row(rounds: list[dict]) -> dict:
    """Each figure's median over the rounds (a ratio's too: the median of the per-round ratios);
    errors summed."""
    out: dict = {}
    for target in (*TARGETS, "ratios"):
        keys = [k for k, v in rounds[0][target].items() if isinstance(v, (int, float))]
        out[target] = {k: round(float(np.median([r[target][k] for r in rounds if r[target].get(k) is not None]
                                                or [np.nan])), 3) for k in keys}
        out[target]["errors"] = dict(sum((Counter(r[target].get("errors", {})) for r in rounds), Counter()))
    return out


def alternate(args, loads: dict, pids: dict) -> list[dict]:
    """`--rounds` rounds of every target in turn, ids running on: no request is sent twice."""
    rounds, next_id = [], 0
    for index in range(args.rounds):
        row = {}
        for target in TARGETS:
            plan = Schedule(next_id, args.rate, args.warmup, args.duration)
            next_id += plan.n
            row[target] = measure(loads[target], plan, pids[target])
        row["ratios"] = ratios(row)
        rounds.append(row)
        print("\n".join(table(f"round {index + 1}", row)), flush=True)
    return rounds


def run(args) -> dict:
    config, loadavg = ROOT / "config.yaml", os.getloadavg()
    workload = build_workload(config, ROUTE)
    http_port, echo_port, path = free_port(), free_port(), f"/v2/models/{ROUTE}/infer"
    with tempfile.TemporaryDirectory(prefix="bench-http-") as tmp, Broker() as broker:
        daemon = start_daemon(config, Path(tmp), "bench-http", {"http": {"port": http_port}}, broker.address,
                              Path(tmp) / "daemon.log", pythonpath=ROOT, session=True)
        echo = mqtt = None
        try:
            wait_ready(http_port, daemon.proc, f"the daemon's HTTP listener (see {daemon.log})")
            echo = subprocess.Popen([sys.executable, __file__, "--serve-echo", str(echo_port)])
            wait_ready(echo_port, echo, "the echo server")
            mqtt = MqttLoad(broker.port, workload)
            loads = {"http": lambda plan: http_load(http_port, path, DEVICE, workload, plan, args.connections),
                     "mqtt": mqtt.run,
                     "echo": lambda plan: http_load(echo_port, path, DEVICE, workload, plan, args.connections)}
            own = {"client_cpu_us": os.getpid()}  # the load generator itself: it shares the cores
            pids = {"http": {"cpu_us": daemon.proc.pid, **own}, "echo": {"cpu_us": echo.pid, **own},
                    "mqtt": {"cpu_us": daemon.proc.pid, "broker_cpu_us": broker.pid, **own}}
            rounds = alternate(args, loads, pids)
        finally:
            if mqtt is not None:
                mqtt.close()
            if echo is not None:
                end_process(echo)
            daemon.stop()
    meta = {"route": ROUTE, "config": "config.yaml + http.port", "rate": args.rate, "connections": args.connections,
            "duration_s": args.duration, "warmup_s": args.warmup, "cpus": os.cpu_count(), "loadavg_at_start": loadavg}
    return {"meta": meta, "rounds": rounds, "median": median_row(rounds)}


COLUMNS = (("sent", "sent"), ("results", "results"), ("results_per_s", "results/s"), ("hits", "hits"),
           ("lost", "lost"), ("p50_ms", "p50 ms"),
           ("p99_ms", "p99 ms"), ("max_ms", "max ms"), ("send_late_p99_ms", "late p99"), ("cpu_us", "CPU µs"),
           ("broker_cpu_us", "broker µs"), ("client_cpu_us", "client µs"))


def table(title: str, row: dict) -> list[str]:
    lines = [f"{title:10}" + "".join(f"{head:>10}" for _, head in COLUMNS) + "  errors (CPU µs: per result)"]
    for target in TARGETS:
        cells = "".join(f"{row[target].get(key, ''):>10}" for key, _ in COLUMNS)
        lines.append(f"  {target:8}{cells}  {row[target].get('errors') or ''}")
    lines.append("  ratios  " + ", ".join(f"{k} {v}" for k, v in row["ratios"].items()))
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of http, mqtt, echo")
    parser.add_argument("--duration", type=float, default=8.0, help="measured seconds per target and round")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of load before each, not counted")
    parser.add_argument("--rate", type=float, default=1000.0, help="requests per second, open loop")
    parser.add_argument("--connections", type=int, default=16, help="HTTP keep-alive connections")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write every figure there as JSON")
    parser.add_argument("--serve-echo", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_echo:
        EchoServer((HOST, args.serve_echo), EchoHandler).serve_forever()
        return 0
    results = run(args)
    print("\n".join(table("median", results["median"])))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
