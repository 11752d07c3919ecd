#!/usr/bin/env python3
"""Per-message cost of the worker path (decode -> pipeline -> encode) vs the naive inline body.

    .venv/bin/python tools/dev/profile_worker.py [--n 3000] [--route activity] [--profile]

No MQTT: this isolates what a worker does from transport and threading costs. `--serving` also
times one request through what serves it around the pipeline, at batch 1 (intake, admission, the
worker's batch with the cache and the stats, the replies to a stand-in transport), on the config
as written, each request distinct.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import dataclasses
import json
import pstats
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from daemon.config.loader import load_config
from daemon.lifecycle.service import Service
from daemon.model.runtime import Model
from daemon.pipeline import (
    codecs,
    request_path,
)
from daemon.pipeline.evaluate import find_route
from daemon.pipeline.route_pipeline import route_pipeline
from daemon.tools import baselines
from daemon.transport.inbound import Inbound


def per_call_us(fn, n: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


class _Transport:
    """Takes the replies (the cost of MQTT is not what this measures)."""

    def reply(self, topic: str, payload: bytes, inbound: object) -> None:
        pass

    def publish(self, *args: object, **kwargs: object) -> None:
        pass

    def batch(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


def serving_us(config, route, n: int) -> float:
    """One distinct request at a time through intake and a worker's batch, in this thread."""
    config = dataclasses.replace(config, cache=dataclasses.replace(config.cache, dir=Path(tempfile.mkdtemp())))
    service = Service(config)
    service._load_models(), service._open_cache(), service._build_serving()
    serving = service._serving
    serving.attach(_Transport())
    jobs: list = []
    serving.intake._submit_many = lambda queued: jobs.extend(queued) or True  # the worker is this thread
    context = serving.pool._make_context(0)
    with np.load(route.validate_data) as data:
        rows = data["x"]
    noise = np.random.default_rng(0).normal(0, 0.01, size=(n + 1, *rows.shape[1:]))
    topic = route.subscribe.replace("+", "d1")
    payloads = [json.dumps({"id": i, "data": np.round(rows[i % len(rows)] + noise[i], 4).tolist()}).encode()
                for i in range(n + 1)]
    sequence = iter(range(n + 1))

    def one() -> None:
        i = next(sequence)
        serving.intake.on_burst((Inbound(topic, payloads[i], 1, i + 1, time.monotonic()),))
        batch = jobs[:]
        jobs.clear()
        serving.pool._process(context, batch)

    try:
        return per_call_us(one, n)
    finally:
        service._close_cache()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--route", default="activity", help="a JSON route of config.yaml with `validate` data")
    parser.add_argument("--serving", action="store_true", help="also time intake -> worker batch -> reply")
    parser.add_argument("--profile", action="store_true", help="also print the top functions of the worker path")
    args = parser.parse_args()
    config = load_config(ROOT / "config.yaml")
    route = find_route(config, args.route)
    model = Model(config.models[route.model].path)
    pipe = route_pipeline(config, route, model)
    with np.load(route.validate_data) as data:
        payload = json.dumps({"id": 1, "data": data["x"][0].tolist()}).encode()

    def worker_path() -> bytes:
        return codecs.encode(request_path.handle(pipe, payload, model, None, time.monotonic(), time.monotonic))

    _, naive_answer = baselines.make_answer(ROOT / "config.yaml", args.route)  # what the naive script runs

    def naive_body() -> str:
        return naive_answer(payload)

    if args.serving:
        print(f"serving at batch 1 {serving_us(config, route, args.n):.1f} µs")
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
