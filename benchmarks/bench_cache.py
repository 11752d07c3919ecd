#!/usr/bin/env python3
"""CPU cost of the result cache per request: cache on vs off, on a stream that never repeats.

    .venv/bin/python benchmarks/bench_cache.py [--routes activity-raw appliance-raw] [--requests 5000]
                                            [--rounds 3] [--root DIR] [--repeat-share 0.0]

For each route of config.yaml (its bundled model, one interpreter, batch buckets up to 32),
`--requests` distinct requests (the route's test data plus noise, so each quantizes to a new
input) go through the pure request path, `handle_batch` then `store` (what a worker does), in
batches of 8 to 32, once with no cache and once with a ResultCache of the default config in a
temporary directory, alternating, `--rounds` times. Each round's figure is process CPU time
(every thread: the disk writer's too, flushed at the end of the round) per request; the
difference on - off is the cache's cost. `--root` runs another checkout's daemon package (say,
the commit before) with this same script, for a before/after pair in one sitting.
`--repeat-share` makes that share of the requests exact repeats of earlier ones.
Then the last round's requests go through the same cache twice more: the second pass is
admitted and stored, the third is all hits, so the third against the first is what a hit
costs against a miss in the pipeline (no MQTT: the transport's cost is the same for both).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
NOISE_STD = 2.0  # sensor units: every request quantizes to a new model input


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--routes", nargs="+", default=["activity-raw", "appliance-raw"])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout whose daemon/ is measured")
    parser.add_argument("--repeat-share", type=float, default=0.0)
    return parser.parse_args()


def _payloads(route, model_dir: Path, n: int, repeat_share: float, rng) -> list[bytes]:
    with np.load(model_dir / "test.npz", allow_pickle=False) as data:
        x = data["x"].astype(np.float32)
    rows = x[np.arange(n) % len(x)] + rng.normal(0.0, NOISE_STD, (n, *x.shape[1:])).astype(np.float32)
    for i in range(1, n):
        if rng.random() < repeat_share:
            rows[i] = rows[int(rng.integers(0, i))]
    if route.input.format == "raw":
        return [r.astype("<f4").tobytes() for r in rows]
    return [b'{"id": %d, "data": %s}' % (i, str(r.ravel().tolist()).encode()) for i, r in enumerate(rows)]


def _round(request_path, Request, pipe, model, requests: list[bytes], sizes: list[int], cache) -> float:
    """CPU seconds per request of one pass over `requests`, flushed to disk when there is a cache."""
    start, i = time.process_time(), 0
    for size in sizes:
        batch = [Request(p, time.monotonic()) for p in requests[i:i + size]]
        i += size
        outcome = request_path.handle_batch(pipe, batch, model, cache, time.monotonic)
        request_path.store(cache, outcome)
    if cache is not None:
        cache.flush(60.0)
    return (time.process_time() - start) / len(requests)


def _bench_route(args, name: str) -> None:
    from daemon.cache import result_cache
    from daemon.config.loader import load_config
    from daemon.config.model_files import open_model
    from daemon.pipeline import request_path
    from daemon.pipeline.route_pipeline import Request, route_pipeline

    config = load_config(args.root / "config.yaml")
    route = next(r for r in config.routes if r.name == name)
    model = open_model(config, route.model, max_batch=32)
    model.warm_up()
    pipe = route_pipeline(config, route, model)
    rng = np.random.default_rng(0)
    sizes, left = [], args.requests
    while left > 0:
        sizes.append(min(left, int(rng.integers(8, 33))))
        left -= sizes[-1]
    off, on, snaps = [], [], []
    for r in range(args.rounds):
        requests = _payloads(route, config.models[route.model].path.parent, args.requests, args.repeat_share,
                             np.random.default_rng(100 + r))  # new inputs every round: nothing carries over
        off.append(_round(request_path, Request, pipe, model, requests, sizes, None))
        with tempfile.TemporaryDirectory() as tmp:
            cache = result_cache.ResultCache(type(config.cache)(dir=Path(tmp) / "cache"))
            on.append(_round(request_path, Request, pipe, model, requests, sizes, cache))
            snaps.append(cache.snapshot())
            if r == args.rounds - 1:
                passes = [_round(request_path, Request, pipe, model, requests, sizes, cache) for _ in range(2)]
            cache.close()
    delta = [b - a for a, b in zip(off, on)]
    print(f"{name}: model {route.model} ({model.cost_per_sample_s * 1e6:.1f} µs/sample), {args.requests} requests "
          f"x {args.rounds} rounds, batches 8-32, root {args.root}")
    print(f"  cache off  µs/request: {' '.join(f'{v * 1e6:7.1f}' for v in off)}")
    print(f"  cache on   µs/request: {' '.join(f'{v * 1e6:7.1f}' for v in on)}")
    print(f"  on - off   µs/request: {' '.join(f'{v * 1e6:7.1f}' for v in delta)}   "
          f"median {statistics.median(delta) * 1e6:.1f}")
    print(f"  same data again: 2nd pass (stored) {passes[0] * 1e6:.1f}, 3rd pass (hits) {passes[1] * 1e6:.1f} "
          f"µs/request: a hit costs {passes[1] / on[-1]:.2f}x a miss (cache on, 1st pass)")
    last = snaps[-1]
    print("  last round's cache: " + ", ".join(f"{k} {last.get(k)}" for k in
                                               ("entries", "hits", "misses", "admitted", "refused", "writes",
                                                "dropped_writes", "disk_read_us")))


def main() -> None:
    args = _parse()
    sys.path.insert(0, str(args.root.resolve()))
    for name in args.routes:
        _bench_route(args, name)


if __name__ == "__main__":
    main()
