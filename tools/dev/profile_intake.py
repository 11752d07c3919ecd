#!/usr/bin/env python3
"""CPU per request of serving without MQTT: intake (route, admit, hand-off) + workers + replies.

    .venv/bin/python tools/dev/profile_intake.py [--route activity] [--n 4000] [--burst 32]
                                               [--workers 1] [--gc default|freeze|gen0=N] [--rounds 3]

A recorder stands in for the transport (it counts replies, parses nothing). Requests are
handed to `Intake.on_burst` in bursts of `--burst`, as the transport delivers one read
burst, while the workers serve them; the process CPU (all threads) from the first burst
to the last reply, divided by the requests, is the figure. `intake_us` is the same
hand-off with the workers not started (intake alone). `gc0_per_1k` is how many
generation-0 collections ran per 1,000 requests. Cache off: the cache is measured apart.

EDGE_INFERD_ROOT=/another/checkout runs the same measurement on another tree's code (to
compare before and after side by side in one loop).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(os.environ.get("EDGE_INFERD_ROOT") or Path(__file__).resolve().parents[2])
sys.path.insert(0, str(ROOT))

from daemon.config.loader import load_config  # noqa: E402
from daemon.config.schema import BatchingConfig, WorkersConfig  # noqa: E402
from daemon.model.runtime import Model  # noqa: E402
from daemon.obs.stats import Stats  # noqa: E402
from daemon.pipeline.evaluate import find_route  # noqa: E402
from daemon.pipeline.route_pipeline import route_pipeline  # noqa: E402
from daemon.serve import wiring  # noqa: E402
from daemon.transport.inbound import Inbound  # noqa: E402

TOPICS = {"activity": "sensors/d{}/imu", "appliance": "plugs/d{}/power"}
DEVICES = 50
WARM_UP = 64  # requests served before the measured ones


class Recorder:
    """The transport seam: counts replies and acks, sets `done` at the n-th reply."""

    def __init__(self, n: int):
        self.n = n
        self.replies = 0
        self.errors = 0
        self.done = threading.Event()
        self._lock = threading.Lock()

    def publish(self, topic, payload, retain=False, correlation_data=None):
        return None

    def ack(self, inbound):
        pass

    def reply(self, topic, payload, inbound):
        with self._lock:
            self.replies += 1
            self.errors += b'"error"' in payload
            if self.replies >= self.n:
                self.done.set()

    def batch(self):
        return contextlib.nullcontext()


def _payloads(route: str, n: int) -> list[bytes]:
    with np.load(ROOT / f"models/{route}/test.npz") as data:
        xs = data["x"]
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):  # distinct requests: a sensor stream never repeats exactly
        x = xs[i % len(xs)] + rng.normal(0, 1e-3, xs.shape[1:]).astype(np.float32)
        out.append(json.dumps({"id": i, "data": x.tolist()}).encode())
    return out


def _inbounds(route: str, payloads: list[bytes], first: int = 0) -> list[Inbound]:
    topic = TOPICS[route]
    now = time.monotonic()
    return [Inbound(topic=topic.format(i % DEVICES), payload=p, qos=1, mid=i + 1, received_at=now)
            for i, p in enumerate(payloads, first)]


def _serving(route_name: str, workers: int, stats: Stats):
    config = load_config(ROOT / "config.yaml")
    route = find_route(config, route_name)
    mc = config.models[route.model]
    reference = Model(mc.path)
    pipe = route_pipeline(config, route, reference)
    batching = BatchingConfig()
    cfg = WorkersConfig(max=workers, min=workers, queue_mb=1024, max_wait_ms=1e9)  # no shedding, either tree
    return wiring.build([pipe], None, stats, cfg, lambda i: {route.model: Model(mc.path, max_batch=batching.max_batch)},
                        batching)


def _set_gc(mode: str) -> None:
    gc.enable()
    gc.set_threshold(700, 10, 10)
    if mode.startswith("gen0="):
        gc.set_threshold(int(mode.split("=", 1)[1]), 10, 10)
    elif mode == "freeze":
        gc.collect()
        gc.freeze()


def _gc0() -> int:
    return gc.get_stats()[0]["collections"]


def _feed(serving, route: str, payloads: list[bytes], burst: int) -> None:
    """The payloads in bursts, each burst's Inbounds made as the transport makes them: on arrival."""
    for start in range(0, len(payloads), burst):
        serving.intake.on_burst(_inbounds(route, payloads[start:start + burst], start))


def _round(route: str, payloads: list[bytes], args) -> dict:
    serving = _serving(route, args.workers, Stats())
    recorder = Recorder(WARM_UP)
    serving.attach(recorder)
    serving.start()
    _feed(serving, route, payloads[:WARM_UP], args.burst)  # the fit, the arenas
    assert recorder.done.wait(60), "warm-up not answered"
    recorder.replies, recorder.errors, recorder.n = 0, 0, len(payloads)
    recorder.done.clear()
    _set_gc(args.gc)
    gc0, cpu, wall = _gc0(), time.process_time(), time.perf_counter()
    _feed(serving, route, payloads, args.burst)
    assert recorder.done.wait(300), f"{recorder.replies} of {len(payloads)} answered"
    cpu, wall, gc0 = time.process_time() - cpu, time.perf_counter() - wall, _gc0() - gc0
    serving.stop(30)
    gc.unfreeze()
    n = len(payloads)
    return {"cpu_us": cpu / n * 1e6, "per_s": n / wall, "errors": recorder.errors, "gc0_per_1k": gc0 / n * 1000}


def _intake_only(route: str, payloads: list[bytes], args) -> float:
    serving = _serving(route, args.workers, Stats())  # workers never started: jobs stay queued
    serving.attach(Recorder(len(payloads)))
    _set_gc(args.gc)
    cpu = time.process_time()
    _feed(serving, route, payloads, args.burst)
    cpu = time.process_time() - cpu
    gc.unfreeze()
    assert serving.pool.depth == len(payloads)
    return cpu / len(payloads) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--route", default="activity", choices=sorted(TOPICS))
    parser.add_argument("--n", type=int, default=4000)
    parser.add_argument("--burst", type=int, default=32)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--gc", default="default", help="default | freeze | gen0=N")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    payloads = _payloads(args.route, args.n)
    rows = []
    for _ in range(args.rounds):
        intake = _intake_only(args.route, payloads, args)
        rows.append({**_round(args.route, payloads, args), "intake_us": intake})
    best = {key: round(min(r[key] for r in rows) if key != "per_s" else max(r[key] for r in rows), 2)
            for key in rows[0]}
    print(json.dumps({"root": str(ROOT), "route": args.route, "workers": args.workers, "gc": args.gc,
                      "burst": args.burst, "n": args.n, "best": best,
                      "rounds": [{k: round(v, 2) for k, v in r.items()} for r in rows]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
