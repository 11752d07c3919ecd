"""`edge-inferd bench e2e`: echo floor, naive script and the daemon, side by side.

One private mosquitto, one reply collector (`mosquitto_sub`), C publishers
(`mosquitto_pub -l`), and each consumer as its own process, measured one after the
other with the same requests. Machines are noisy: compare the ratios within a run.
Phases (docs/performance.md, "bench e2e"): drain, openloop, cache, batching.
"""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from daemon.bench_load import require_clients
from daemon.bench_phases import Bench, Consumer, Phases, parse_rate
from daemon.broker import Broker

logger = logging.getLogger(__name__)

PHASES = ("drain", "openloop", "cache", "batching")

_WORKERS = {"max": 2, "queue_mb": 64, "max_wait_ms": 2000}
BATCH_OFF = {"workers": _WORKERS, "batching": {"max_batch": 1, "max_delay_ms": 0}, "cache": {"enabled": False}}
BATCH_ON = {"workers": _WORKERS, "batching": {"max_batch": 32, "max_delay_ms": 0}, "cache": {"enabled": False}}
WAIT_500 = {**BATCH_ON, "workers": {**_WORKERS, "max_wait_ms": 500}}
CACHE_ON = {**BATCH_ON, "cache": {"enabled": True}}

DEFAULT_REQUESTS = 5000
DEFAULT_DURATION_S = 5.0
# Offered loads: plain numbers are req/s, "Nx" multiples of the batching-off daemon's drain rate.
DEFAULT_RATES = ("1000", "0.25x", "0.5x", "1x", "1.5x", "2x")
SETTLE_S = 5.0  # a measurement ends when all are answered or nothing came back for this long
QUICK = {"requests": 300, "duration": 0.5, "rates": ("300", "1x"), "warmup": 10}
WARMUP_REQUESTS = 50


# Measured in this order: the first daemon's drain rate sets the open-loop rates.
CONSUMERS = (Consumer("daemon-b1", "daemon", BATCH_OFF), Consumer("daemon-b32", "daemon", BATCH_ON),
             Consumer("naive", "naive"), Consumer("echo", "echo"))
WAIT_500_CONSUMER = Consumer("daemon-b32-wait500", "daemon", WAIT_500)
CACHE_CONSUMER = Consumer("daemon-b32-cache", "daemon", CACHE_ON)


@dataclass
class Plan:
    config: Path
    out: Path
    requests: int = DEFAULT_REQUESTS
    duration: float = DEFAULT_DURATION_S
    rates: tuple[str, ...] = DEFAULT_RATES
    phases: tuple[str, ...] = PHASES
    settle: float = SETTLE_S
    warmup: int = WARMUP_REQUESTS

    @classmethod
    def build(cls, config: Path, out: Path, requests: Optional[int] = None, duration: Optional[float] = None,
              rates: Optional[list[str]] = None, quick: bool = False, only: Optional[list[str]] = None) -> "Plan":
        base = dict(QUICK) if quick else {}
        for key, value in (("requests", requests), ("duration", duration), ("rates", rates)):
            if value is not None:
                base[key] = tuple(value) if key == "rates" else value
        phases = tuple(p for p in PHASES if not only or p in only or (p == "drain" and "openloop" in only))
        for rate in base.get("rates", ()):
            parse_rate(rate, 1.0)
        return cls(config=config, out=out, phases=phases, **base)


def run_bench(plan: Plan) -> dict:
    """Every selected phase against one private broker; the results as one dict."""
    require_clients()
    started = time.monotonic()
    with Broker() as broker, tempfile.TemporaryDirectory(prefix="edge-inferd-bench-") as tmp:
        logger.info("mosquitto on %s; phases %s", broker.address, ", ".join(plan.phases))
        bench = Bench(broker.address, Path(tmp), plan)
        try:
            Phases(bench, CONSUMERS, WAIT_500_CONSUMER, CACHE_CONSUMER).run()
        finally:
            bench.close()
    bench.results["meta"] = meta(plan, time.monotonic() - started)
    return bench.results


def meta(plan: Plan, wall_s: float) -> dict:
    import os
    import platform

    consumers = {c.name: c.overrides for c in (*CONSUMERS, WAIT_500_CONSUMER, CACHE_CONSUMER)}
    return {"wall_s": round(wall_s, 1), "cpus": os.cpu_count(), "machine": platform.machine(),
            "python": platform.python_version(), "overrides": consumers,
            "plan": {"requests": plan.requests, "duration_s": plan.duration, "rates": list(plan.rates),
                     "phases": list(plan.phases), "settle_s": plan.settle, "warmup": plan.warmup}}
