"""At-least-once at 2x overload, no deadline, on the default transport: every request answered.

The reproduction of issue 35's loss. mosquitto 2.0.11, the bundled config as written (native on
MQTT v5), the 150-value 1-D CNN (gunpoint): its drain capacity is measured first, then an open
loop at twice that (8,000/s at least), distinct requests, results counted by id. Repeated on a fresh daemon each
round (the loss came in half the runs), each round's persistent session ended after it.

Before the native link nudged a silent broker (daemon/transport/native_conn.py, NUDGE_S), 4 of 4
rounds of 80,000 at 8,000/s stalled here with 1,309-6,266 results: mosquitto held the PUBACKs of
the daemon's replies until the daemon wrote again, and the daemon, waiting for them, wrote nothing.
Before it read no more than its ReceiveMaximum of unacked requests (native.py, `_reads`), the first
round lost 10,586 of 121,154: mosquitto wrote its whole backlog to the daemon, which held ~99,000
requests unacked, and past max_queued_messages the broker dropped the rest (docs/reliability.md,
"A broker that goes quiet").
"""

from __future__ import annotations

import shutil

import pytest

from daemon.tools.bench.phases import Bench
from daemon.tools.bench.plan import Plan
from daemon.tools.bench.stress import DEFAULT, OVERLOAD_MULTIPLE
from daemon.tools.bench.workload import build_workload
from daemon.obs.stats_topic import stopped_stats
from tests.integration.conftest import ROOT

pytestmark = pytest.mark.serial  # measures the drain capacity, then 2x it: run alone (scripts/test.sh)

ROUNDS = 2
DRAIN_REQUESTS = 4000
OVERLOAD_S = 10.0
# The load: 8,000/s was 2x the drain capacity where the loss was seen; a faster host gets 2x its own.
MIN_RATE = 8000.0
ROUTE = "gunpoint"
# How long the replies may pause before the count is taken: the issue counted them after a 60-90 s
# wait. Under a sustained overload the replies wait behind the broker's backlog (docs/reliability.md)
# and come all at once after it: on a box busy with other work that pause passed 15 s.
SETTLE_S = 60.0


@pytest.mark.skipif(shutil.which("mosquitto_pub") is None, reason="mosquitto_pub missing: apt-get install "
                    "mosquitto-clients (./scripts/setup.sh does this)")
@pytest.mark.parametrize("round_", range(ROUNDS))
def test_twice_the_drain_capacity_without_deadlines_loses_nothing(tmp_path, broker, round_):
    plan = Plan(config=ROOT / "config.yaml", out=tmp_path, route=ROUTE, settle=SETTLE_S)
    workload = build_workload(plan.config, ROUTE)
    bench = Bench(f"127.0.0.1:{broker.port}", tmp_path, plan, reply_filters=(workload.reply_topic,))
    try:
        proc = bench.start(DEFAULT)
        try:
            capacity = bench.drain(proc, workload.line, workload.request_topic, DRAIN_REQUESTS)
            rate = max(MIN_RATE, OVERLOAD_MULTIPLE * capacity["rps"])
            point, run = bench.paced(proc, workload.request_topic, rate, OVERLOAD_S, workload.line)
        finally:
            proc.stop()
    finally:
        bench.close()
    stats = stopped_stats(proc.log.read_text(errors="replace")) or {}
    published = 2 * plan.warmup + capacity["sent"] + point["sent"]
    where = (f"{point['sent']} sent at {rate:.0f}/s: {point['results']} results, {point['lost']} unanswered; the "
             f"daemon received {stats.get('received')} of {published} published; outbox {stats.get('outbox')}")
    assert capacity["lost"] == 0 and point["lost"] == 0, where
    assert point["results"] == point["sent"], where  # no deadline, no limit: nothing may be shed
    assert stats.get("received", 0) >= published, where
