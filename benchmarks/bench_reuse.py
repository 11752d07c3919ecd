#!/usr/bin/env python3
"""Hit rate, CPU and accuracy of the per-device reuse fast path (routes[].reuse) on the bundled test sets.

    python benchmarks/bench_reuse.py [--eps 0.05 0.1 0.25 0.5 1.0] [--step 0.1] [--repeat 5] [--batch round 1]
                                  [--per-device]

Each class's test series are joined into one long recording, one device per class, and
each device sends overlapping sliding windows of the route's input length, `--step` of a
window apart; every window is labelled with its class. Each round (one window per
device) goes through the real pipeline (`daemon.pipeline.request_path.handle_batch`, the daemon's
model and preprocessing, no result cache) on a virtual clock advancing `--period`
seconds per round, either as one batch (`--batch round`: a loaded daemon, whose workers
batch what queued up) or one request per call (`--batch 1`: a lightly loaded daemon,
where each request reaches a worker alone). The same replay runs without reuse and with
reuse at each epsilon, the variants taking turns within each of `--repeat` passes (each
with a fresh reuse state) so that they share the machine's noise; CPU is this process's
CPU time (time.process_time) over the replays. Prints one JSON line per (route, batch, epsilon).
`--per-device` then replays each device alone, one request per call: a quiet device (a
standing wearer) and a busy one (running) apart, as a fleet of mostly idle sensors would be.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from daemon.config.reuse import ReuseConfig
from daemon.config.loader import load_config
from daemon.config.model_files import open_model  # noqa: E402
from daemon.pipeline.evaluate import find_route, load_split
from daemon.pipeline.route_pipeline import route_pipeline  # noqa: E402
from daemon.pipeline.route_pipeline import Request
from daemon.pipeline.request_path import handle_batch  # noqa: E402
from daemon.pipeline.reuse import DeviceReuse  # noqa: E402

ROUTES = {"activity-raw": "models/activity/test.npz", "appliance-raw": "models/appliance/test.npz"}
MAX_AGE_S = 30.0


def recordings(x: np.ndarray, y: np.ndarray, step_frac: float) -> tuple[np.ndarray, np.ndarray]:
    """(rounds, devices, *window) sliding windows, one device per class, and each device's label."""
    classes = np.unique(y)
    length = x.shape[1]
    step = max(1, int(round(length * step_frac)))
    per_device = []
    for c in classes:
        long = np.concatenate(list(x[y == c]), axis=0)  # the class's series end to end, along time
        starts = range(0, long.shape[0] - length + 1, step)
        per_device.append(np.stack([long[s:s + length] for s in starts]))
    rounds = min(len(w) for w in per_device)
    return np.stack([w[:rounds] for w in per_device], axis=1), classes


def replay(pipe, model, windows: np.ndarray, labels: np.ndarray, reuse: Optional[DeviceReuse],
           period_s: float, batch: str) -> tuple[int, int]:
    """(correct, reused) over every window; one batch per round, or one call per request (`batch` "1")."""
    correct = reused = 0
    devices = [f"dev{i}" for i in range(windows.shape[1])]
    for k, round_x in enumerate(windows):
        now = k * period_s
        requests = [Request(w.astype("<f4").tobytes(), now, None, d) for w, d in zip(round_x, devices)]
        groups = [requests] if batch == "round" else [[r] for r in requests]
        replies = [o for g in groups for o in handle_batch(pipe, g, model, None, lambda: now, reuse).replies]
        correct += sum(int(r["index"] == label) for r, label in zip(replies, labels))
        reused += sum(bool(r.get("reused")) for r in replies)
    return correct, reused


def measure(pipe, model, windows, labels, eps_list: list, repeat: int, period_s: float, batch: str) -> list[dict]:
    """One row per epsilon (None: without reuse); the variants take turns within each pass."""
    replay(pipe, model, windows, labels, None, period_s, batch)  # warm-up: interpreters, arenas
    cpu_s, results = [0.0] * len(eps_list), [(0, 0)] * len(eps_list)
    for _ in range(repeat):
        for i, eps in enumerate(eps_list):
            reuse = None if eps is None else DeviceReuse(ReuseConfig(eps, MAX_AGE_S))
            started = time.process_time()
            results[i] = replay(pipe, model, windows, labels, reuse, period_s, batch)
            cpu_s[i] += time.process_time() - started
    n = windows.shape[0] * windows.shape[1]
    return [{"batch": batch, "eps": eps, "n": n, "accuracy": round(correct / n, 4), "hit_rate": round(reused / n, 4),
             "cpu_us_per_request": round(cpu / (repeat * n) * 1e6, 1)}
            for eps, cpu, (correct, reused) in zip(eps_list, cpu_s, results)]


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "config.yaml"))
    parser.add_argument("--eps", type=float, nargs="+", default=[0.05, 0.1, 0.25, 0.5, 1.0])
    parser.add_argument("--step", type=float, default=0.1, help="window step, as a fraction of the window")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--period", type=float, default=1.0, help="virtual seconds between a device's requests")
    parser.add_argument("--batch", nargs="+", choices=["round", "1"], default=["round", "1"],
                        help="round: one handle_batch per round (all devices); 1: one per request")
    parser.add_argument("--per-device", action="store_true",
                        help="also replay each device alone (one request per call): quiet and busy devices apart")
    args = parser.parse_args(argv)
    config = load_config(Path(args.config))
    for name, data in ROUTES.items():
        route = find_route(config, name)
        model = open_model(config, route.model)
        model.warm_up()  # the per-sample cost the daemon's workers measure at start (reuse in a batch depends on it)
        pipe = route_pipeline(config, route, model)
        windows, labels = recordings(*load_split(ROOT / data, route), args.step)
        cost = {"invoke_us_per_sample": round(model.cost_per_sample_s * 1e6, 1)}  # reuse in a batch from 10
        for batch in args.batch:
            report(args, {"route": name, **cost}, pipe, model, windows, labels, batch)
        for d, label in enumerate(labels if args.per_device else []):
            device = {"route": name, "device": pipe.labels[int(label)]}
            report(args, device, pipe, model, windows[:, d:d + 1], labels[d:d + 1], "1")
    return 0


def report(args, key: dict, pipe, model, windows, labels, batch: str) -> None:
    """One JSON line without reuse, then one per epsilon with its accuracy change and CPU saved."""
    base, *rows = measure(pipe, model, windows, labels, [None, *args.eps], args.repeat, args.period, batch)
    print(json.dumps({**key, **base, "step": args.step}), flush=True)
    for row in rows:
        row["accuracy_change_pt"] = round((row["accuracy"] - base["accuracy"]) * 100, 2)
        row["cpu_saved"] = round(1 - row["cpu_us_per_request"] / base["cpu_us_per_request"], 3)
        print(json.dumps({**key, **row, "step": args.step}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
