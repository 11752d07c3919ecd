#!/usr/bin/env python3
"""Step load against the real daemon: idle, then a multiple of one worker's capacity, then idle.

    python benchmarks/step_load.py                       # docs/bench-autoscale.png and .csv
    python benchmarks/step_load.py --cooldown 30 --idle-after 130

A private mosquitto (daemon/tools/broker.py), one reply collector and one open-loop publisher
(`mosquitto_pub -l`, daemon/tools/bench/load.py). First one worker's capacity is measured: a
burst drained by a daemon with workers {min: 1, max: 1}. Then a daemon with workers
{min: 1, max: 4} (`python -m daemon run --config <tmp config>`) gets nothing for
`--idle-before` seconds, `--load` x that capacity for `--step` seconds, and nothing for
`--idle-after` seconds, while its worker count is read from the retained stats topic
`edge-inferd/<client_id>/stats` (stats_interval_s 0.2). Batching is off (max_batch 1)
and so is the cache, so one worker's capacity is one request at a time and a backlog
can only be served by more workers.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from daemon.tools.bench.plan import Plan  # noqa: E402
from daemon.tools.bench.load import LinePublisher, host_port, json_line  # noqa: E402
from daemon.tools.broker import end_process  # noqa: E402
from daemon.tools.bench.phases import REQUEST_TOPIC, Bench, Consumer, activity_lines  # noqa: E402
from daemon.tools.broker import Broker  # noqa: E402

BIN_S = 0.2  # the plot's time resolution, and the daemon's stats interval
SEND_TICK_S = 0.005  # the publisher writes what is due this often
CAPACITY_REQUESTS = 2000
_COMMON = {"batching": {"max_batch": 1, "max_delay_ms": 0}, "cache": {"enabled": False},
           "stats_interval_s": BIN_S}


def _workers(low: int, high: int, cooldown_s: float) -> dict:
    return {"workers": {"min": low, "max": high, "scale_up_wait_ms": 50, "scale_down_after_s": cooldown_s,
                        "max_wait_ms": 2000}, **_COMMON}


class StatsReader:
    """`mosquitto_sub` on the daemon's stats topic: (seconds since `t0`, workers.threads, queue depth)."""

    def __init__(self, address: str, client_id: str, t0: float):
        topic = f"edge-inferd/{client_id}/stats"
        self._proc = subprocess.Popen(["mosquitto_sub", *host_port(address), "-t", topic],
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.samples: list[tuple[float, int, int]] = []
        self.last: dict = {}
        self._t0 = t0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self._proc.stdout:
            stats = json.loads(line)
            self.last = stats
            self.samples.append((time.perf_counter() - self._t0, stats["workers"]["threads"],
                                 stats["queue"].get("depth", 0)))

    def close(self) -> None:
        end_process(self._proc)


def open_loop(pub: LinePublisher, line, rate: float, seconds: float, first_id: int) -> list[float]:
    """Publish at `rate` req/s for `seconds`, paced from the start (never slowed by the daemon)."""
    sent_at, start, n = [], time.perf_counter(), 0
    total = int(rate * seconds)
    while n < total:
        due = min(total, int((time.perf_counter() - start) * rate) + 1)
        chunk = b"".join(line(first_id + i) for i in range(n, due))
        pub.send(chunk)
        sent_at.extend([time.perf_counter()] * (due - n))
        n = due
        time.sleep(SEND_TICK_S)
    return sent_at


def measure_capacity(bench: Bench, line) -> float:
    proc = bench.start(Consumer("one-worker", "daemon", _workers(1, 1, 30.0)))
    try:
        return bench.drain(proc, line, REQUEST_TOPIC, CAPACITY_REQUESTS)["rps"]
    finally:
        proc.stop()


def run_step(bench: Bench, line, rate: float, args: argparse.Namespace) -> dict:
    proc = bench.start(Consumer("adaptive", "daemon", _workers(1, 4, args.cooldown)))
    client_id = f"bench-adaptive-{bench._started}"
    t0 = time.perf_counter()
    reader = StatsReader(bench.address, client_id, t0)
    pub = LinePublisher(bench.address, REQUEST_TOPIC)
    try:
        time.sleep(args.idle_before)
        step_at = time.perf_counter() - t0
        sent = open_loop(pub, line, rate, args.step, bench.ids(int(rate * args.step)).start)
        step_end = time.perf_counter() - t0
        time.sleep(args.idle_after)
    finally:
        pub.close()
        reader.close()
        proc.stop()
    return {"t0": t0, "step_at": step_at, "step_end": step_end, "sent": [t - t0 for t in sent],
            "samples": reader.samples, "final": reader.last}


def changes(samples: list[tuple[float, int, int]]) -> list[tuple[float, int, int]]:
    """(time, from, to) each time the stats show another worker count."""
    out = []
    for (_, before, _), (t, after, _) in zip(samples, samples[1:]):
        if after != before:
            out.append((round(t, 2), before, after))
    return out


def timeline(run: dict, answered_at: list[float]) -> list[dict]:
    """Per BIN_S: offered and answered req/s, and the last worker count and queue depth the stats showed."""
    end = max([s[0] for s in run["samples"]] + run["sent"] + [0.0])
    rows, samples = [], run["samples"]
    for k in range(int(end / BIN_S) + 1):
        lo, hi = k * BIN_S, (k + 1) * BIN_S
        seen = [s for s in samples if s[0] < hi]
        rows.append({"t_s": round(lo, 2),
                     "offered_rps": sum(lo <= t < hi for t in run["sent"]) / BIN_S,
                     "answered_rps": sum(lo <= t < hi for t in answered_at) / BIN_S,
                     "workers": seen[-1][1] if seen else 1, "queue_depth": seen[-1][2] if seen else 0})
    return rows


def plot(rows: list[dict], summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [r["t_s"] for r in rows]
    fig, (load, workers) = plt.subplots(2, 1, sharex=True, figsize=(9, 5.5))
    load.plot(t, [r["offered_rps"] for r in rows], label="offered", drawstyle="steps-post")
    load.plot(t, [r["answered_rps"] for r in rows], label="answered", drawstyle="steps-post", alpha=0.7)
    load.axhline(summary["capacity_rps"], color="grey", linestyle=":", label="one worker's capacity")
    load.set_ylabel("requests/s")
    load.legend(loc="upper right")
    workers.plot(t, [r["workers"] for r in rows], drawstyle="steps-post", color="tab:green")
    workers.set_ylabel("worker threads")
    workers.set_xlabel("seconds")
    workers.set_yticks(range(0, 5))
    fig.suptitle(f"Step load {summary['load']}x one worker (workers min 1, max 4, scale_up_wait_ms 50, "
                 f"scale_down_after_s {summary['cooldown_s']:g}); {summary['cpus']} CPUs")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--load", type=float, default=2.0, help="the step, in multiples of one worker's capacity")
    parser.add_argument("--idle-before", type=float, default=3.0)
    parser.add_argument("--step", type=float, default=10.0)
    parser.add_argument("--idle-after", type=float, default=30.0)
    parser.add_argument("--cooldown", type=float, default=5.0, help="workers.scale_down_after_s")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench-autoscale")
    args = parser.parse_args()
    config = ROOT / "config.yaml"
    samples, _ = activity_lines(config)
    with Broker() as broker, tempfile.TemporaryDirectory(prefix="edge-inferd-step-") as tmp:
        bench = Bench(broker.address, Path(tmp), Plan(config=config, out=Path(tmp), warmup=20))
        line = lambda i: json_line(i, samples[i % len(samples)])  # noqa: E731
        try:
            capacity = measure_capacity(bench, line)
            run = run_step(bench, line, capacity * args.load, args)
            answered = [r.at - run["t0"] for i, r in bench.collector.by_id.items() if i >= CAPACITY_REQUESTS]
        finally:
            bench.close()
    import os

    summary = {"capacity_rps": capacity, "load": args.load, "offered_rps": round(capacity * args.load, 1),
               "cooldown_s": args.cooldown, "cpus": os.cpu_count(), "step_at_s": round(run["step_at"], 2),
               "step_end_s": round(run["step_end"], 2), "sent": len(run["sent"]), "answered": len(answered),
               "worker_changes": changes(run["samples"]), "final_workers": run["final"].get("workers")}
    rows = timeline(run, answered)
    with open(args.out.with_suffix(".csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, summary, args.out.with_suffix(".png"))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
