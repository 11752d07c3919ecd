#!/usr/bin/env python3
"""Per-message cost of the worker path (decode -> pipeline -> encode) vs the naive inline body.

    .venv/bin/python scripts/profile_worker.py [--n 3000] [--profile]

No MQTT: this isolates what a worker does from transport and threading costs.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from daemon.pipeline import codecs
from daemon.pipeline import request_path  # noqa: E402
from daemon.config.loader import load_config  # noqa: E402
from daemon.pipeline.evaluate import find_route
from daemon.pipeline.route_pipeline import route_pipeline  # noqa: E402
from daemon.model.runtime import Model  # noqa: E402
from naive_baseline import make_answer  # noqa: E402  (scripts/ is on sys.path when run)


def per_call_us(fn, n: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--profile", action="store_true", help="also print the top functions of the worker path")
    args = parser.parse_args()
    config = load_config(ROOT / "config.yaml")
    route = find_route(config, "activity")
    model = Model(config.models["activity"].path)
    pipe = route_pipeline(config, route, model)
    with np.load(ROOT / "models/activity/test.npz") as data:
        payload = json.dumps({"id": 1, "data": data["x"][0].tolist()}).encode()

    def worker_path() -> bytes:
        return codecs.encode(request_path.handle(pipe, payload, model, None, time.monotonic(), time.monotonic))

    _, naive_answer = make_answer()  # the very function scripts/naive_baseline.py runs per message

    def naive_body() -> str:
        return naive_answer(payload)

    decode_only = per_call_us(lambda: json.loads(payload), args.n)
    worker, naive = per_call_us(worker_path, args.n), per_call_us(naive_body, args.n)
    print(f"worker path {worker:.1f} µs   naive body {naive:.1f} µs   of which json.loads {decode_only:.1f} µs")
    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(lambda: [worker_path() for _ in range(args.n)])
        pstats.Stats(profiler).sort_stats("tottime").print_stats(8)
    return 0


if __name__ == "__main__":
    sys.exit(main())
