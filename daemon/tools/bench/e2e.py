"""`edge-inferd bench e2e`: echo floor, naive script and the daemon, side by side.

One private mosquitto, one reply collector (`mosquitto_sub`), C publishers
(`mosquitto_pub -l`), and each consumer as its own process, measured one after the
other with the same requests. Machines are noisy: compare the ratios within a run.
Phases (docs/performance.md, "bench e2e"): drain, openloop, cache, batching, and when named
the stress ones (stress.py): burst30k, overload, openloop1000, cachepair. Any JSON route of
any config (`--route`); `--rounds N` runs every selected phase N times, consumers alternating.
"""

from __future__ import annotations

import logging
import tempfile
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Callable

from daemon.tools.bench.cpus import Placement
from daemon.tools.bench.load import require_clients
from daemon.tools.bench.phases import Bench, Consumer, Phases, raw_reply_topic
from daemon.tools.bench.plan import Plan
from daemon.tools.bench.rounds import merge
from daemon.tools.bench.stress import DEFAULT, STRESS_CONSUMERS, Stress
from daemon.tools.bench.workload import Workload, build_workload, distinct_share
from daemon.tools.broker import Broker

logger = logging.getLogger(__name__)


_WORKERS = {"max": 2, "queue_mb": 64, "max_wait_ms": 2000}
BATCH_OFF = {"workers": _WORKERS, "batching": {"max_batch": 1, "max_delay_ms": 0}, "cache": {"enabled": False}}
BATCH_ON = {"workers": _WORKERS, "batching": {"max_batch": 32, "max_delay_ms": 0}, "cache": {"enabled": False}}
WAIT_500 = {**BATCH_ON, "workers": {**_WORKERS, "max_wait_ms": 500}}
CACHE_ON = {**BATCH_ON, "cache": {"enabled": True}}



# Measured in this order: the first daemon's drain rate sets the open-loop rates. `daemon` is
# the config as written (the bundled one: batching 32, cache on, a persistent session).
# `naive` and `echo` run paho's defaults (MQTT 3.1.1, Nagle on), as people's scripts do.
CONSUMERS = (Consumer("daemon-b1", "daemon", BATCH_OFF), Consumer("daemon-b32", "daemon", BATCH_ON), DEFAULT,
             Consumer("naive", "naive"), Consumer("echo", "echo"))
# --also NAME: measured after CONSUMERS in the drain and openloop phases. The v5 baselines run the
# daemon's own settings (MQTT v5, TCP_NODELAY); daemon-native: the config as written on the v5
# transport; daemon-paho: on the 3.1.1 one (paho, MQTT 3.1.1); daemon-paho-v5: paho on v5, the
# fallback where the mqtt5 package is missing.
V5 = ("--protocol", "5")
ALSO = {c.name: c for c in (Consumer("echo-v5", "echo", args=V5), Consumer("naive-v5", "naive", args=V5),
                            Consumer("daemon-paho", "daemon", {"mqtt": {"transport": "paho", "protocol": "3.1.1"}},
                                     session=True),
                            Consumer("daemon-paho-v5", "daemon", {"mqtt": {"transport": "paho"}}, session=True),
                            Consumer("daemon-native", "daemon", {"mqtt": {"transport": "native"}}, session=True))}
WAIT_500_CONSUMER = Consumer("daemon-b32-wait500", "daemon", WAIT_500)
CACHE_CONSUMER = Consumer("daemon-b32-cache", "daemon", CACHE_ON)


def consumers(plan: Plan) -> tuple[Consumer, ...]:
    """CONSUMERS, then the plan's `--also` ones."""
    return CONSUMERS + tuple(ALSO[name] for name in plan.also)


def run_bench(plan: Plan, make_broker: Callable[[], AbstractContextManager] = Broker) -> dict:
    """Every selected phase, `plan.rounds` times, against one private broker (mosquitto, or what
    `make_broker` starts: benchmarks/bench_rumqttd.py); the results as one dict."""
    require_clients()
    started = time.monotonic()
    workload = build_workload(plan.config, plan.route)
    distinct = distinct_share(plan.config, workload)
    if distinct < 1.0:
        logger.warning("only %.1f%% of the requests' INT8 inputs differ: the cache will find repeats", distinct * 100)
    replies = [workload.reply_topic, *filter(None, [raw_reply_topic(plan.config) if "batching" in plan.phases
                                                    else None])]
    rounds = []
    placement = Placement(plan.consumer_cpus, plan.consumer_cpu_share)
    with placement, make_broker() as broker, tempfile.TemporaryDirectory(prefix="edge-inferd-bench-") as tmp:
        logger.info("%s on %s; route %s; phases %s", getattr(broker, "name", "mosquitto"), broker.address, plan.route, ", ".join(plan.phases))
        bench = Bench(broker.address, Path(tmp), plan, tuple(dict.fromkeys(replies)), preexec=placement.preexec)
        try:
            for n in range(plan.rounds):
                logger.info("round %d of %d", n + 1, plan.rounds)
                bench.results = {phase: {} for phase in plan.phases}
                Phases(bench, consumers(plan), WAIT_500_CONSUMER, CACHE_CONSUMER, workload).run()
                Stress(bench, workload).run()
                rounds.append(bench.results)
        finally:
            bench.close()
    results = merge(rounds)
    results["meta"] = {**meta(plan, workload, distinct, time.monotonic() - started), **placement.meta()}
    return results


def meta(plan: Plan, workload: Workload, distinct: float, wall_s: float) -> dict:
    import os
    import platform

    consumers = {c.name: c.overrides or list(c.args)
                 for c in (*CONSUMERS, *(ALSO[n] for n in plan.also), WAIT_500_CONSUMER, CACHE_CONSUMER,
                           *STRESS_CONSUMERS)}
    return {"wall_s": round(wall_s, 1), "transport": plan.transport, "cpus": os.cpu_count(), "machine": platform.machine(),
            "python": platform.python_version(), "overrides": consumers,
            "workload": {"route": plan.route, "config": str(plan.config), "request_topic": workload.request_topic,
                         "reply_topic": workload.reply_topic, "source": workload.source,
                         "noise_std": round(workload.noise_std, 4), "distinct_int8_inputs": round(distinct, 4)},
            "plan": {"requests": plan.requests, "duration_s": plan.duration, "rates": list(plan.rates),
                     "phases": list(plan.phases), "settle_s": plan.settle, "warmup": plan.warmup,
                     "rounds": plan.rounds, "burst": plan.burst, "also": list(plan.also)}}
