"""`edge-inferd bench model`: per-invoke latency of a route's model per backend, threads and batch."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from daemon.config.schema import Config
from daemon.model.runtime import Model, available_backends
from daemon.pipeline.evaluate import find_route


@dataclass(frozen=True)
class BenchRow:
    backend: str
    threads: int
    batch: int
    p50_us: float
    p99_us: float
    per_sample_us: float


def bench_model(config: Config, route_name: str, batches: tuple[int, ...] = (1, 8), threads: Optional[list[int]] = None,
                iterations: int = 200, backends: Optional[list[str]] = None,
                progress: Callable[[str], None] = lambda _: None) -> list[BenchRow]:
    """Per-invoke latency of the route's model for each backend x threads x batch.

    litert is timed with and without XNNPACK (`litert-ref`, the `xnnpack: false` setting)."""
    route = find_route(config, route_name)
    path = config.models[route.model].path
    variants = [(b, x) for b in backends or available_backends() for x in ((True, False) if b == "litert" else (True,))]
    rows = []
    for backend, xnnpack in variants:
        label = backend if xnnpack or backend != "litert" else "litert-ref"
        for n_threads in threads or list(range(1, (os.cpu_count() or 1) + 1)):
            model = Model(path, backend=backend, num_threads=n_threads, xnnpack=xnnpack, max_batch=max(batches))
            for batch in batches:
                progress(f"{label} threads={n_threads} batch={batch}")
                rows.append(_time_invokes(model, label, n_threads, batch, iterations))
    return rows


def _time_invokes(model: Model, backend: str, threads: int, batch: int, iterations: int) -> BenchRow:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch,) + model.sample_shape).astype(np.float32)
    for _ in range(max(3, iterations // 10)):  # warm-up: arena growth, caches
        model.infer(x)
    times = np.empty(iterations)
    for i in range(iterations):
        start = time.perf_counter()
        model.infer(x)
        times[i] = time.perf_counter() - start
    p50, p99 = np.percentile(times, [50, 99]) * 1e6
    return BenchRow(backend, threads, batch, round(p50, 1), round(p99, 1), round(p50 / batch, 1))


def format_bench(rows: list[BenchRow]) -> str:
    head = f"{'backend':<10} {'threads':>7} {'batch':>5} {'p50 µs':>10} {'p99 µs':>10} {'µs/sample':>10}"
    lines = [head, "-" * len(head)]
    lines += [f"{r.backend:<10} {r.threads:>7} {r.batch:>5} {r.p50_us:>10.1f} {r.p99_us:>10.1f} "
              f"{r.per_sample_us:>10.1f}"
              for r in rows]
    return "\n".join(lines)
