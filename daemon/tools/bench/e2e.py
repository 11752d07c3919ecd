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
from pathlib import Path

from daemon.tools.bench.load import require_clients
from daemon.tools.bench.phases import Bench, Consumer, Phases
from daemon.tools.bench.plan import Plan
from daemon.tools.broker import Broker

logger = logging.getLogger(__name__)


_WORKERS = {"max": 2, "queue_mb": 64, "max_wait_ms": 2000}
BATCH_OFF = {"workers": _WORKERS, "batching": {"max_batch": 1, "max_delay_ms": 0}, "cache": {"enabled": False}}
BATCH_ON = {"workers": _WORKERS, "batching": {"max_batch": 32, "max_delay_ms": 0}, "cache": {"enabled": False}}
WAIT_500 = {**BATCH_ON, "workers": {**_WORKERS, "max_wait_ms": 500}}
CACHE_ON = {**BATCH_ON, "cache": {"enabled": True}}



# Measured in this order: the first daemon's drain rate sets the open-loop rates.
CONSUMERS = (Consumer("daemon-b1", "daemon", BATCH_OFF), Consumer("daemon-b32", "daemon", BATCH_ON),
             Consumer("naive", "naive"), Consumer("echo", "echo"))
WAIT_500_CONSUMER = Consumer("daemon-b32-wait500", "daemon", WAIT_500)
CACHE_CONSUMER = Consumer("daemon-b32-cache", "daemon", CACHE_ON)


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
