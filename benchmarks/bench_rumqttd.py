#!/usr/bin/env python3
"""`edge-inferd bench e2e` on a private rumqttd instead of mosquitto (tests/integration/rumqttd.py).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_rumqttd.py --route gunpoint --only overload \\
        --transport native --out bench-rumqttd

The same phases, options and output as `edge-inferd bench e2e` (daemon/tools/bench/), plus
`--transport` (every daemon's `mqtt.transport`; default: the config's). rumqttd is a test
broker (the PyPI iotcore wheel, in the test extra), so its launcher lives in tests/ and this
script needs a checkout. Its v5 listener takes no 3.1.1 CONNECT, so the bench's mosquitto_pub
and mosquitto_sub speak v5 here. What rumqttd does with a daemon's window (100 messages, its
PUBACKs held while they are unacked) is in daemon/transport/safe_ack.py.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from daemon.cli_parser import build  # noqa: E402
from daemon.tools.bench.e2e import run_bench  # noqa: E402
from daemon.tools.bench.load import use_mqtt5_clients  # noqa: E402
from daemon.tools.bench.plan import Plan  # noqa: E402
from daemon.tools.bench.report import summary, write_outputs  # noqa: E402
from tests.integration.rumqttd import Rumqttd  # noqa: E402


def main(argv: list[str]) -> int:
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--transport", choices=("paho", "native"))
    ours, rest = extra.parse_known_args(argv)
    args = build().parse_args(["bench", "e2e", *rest])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    plan = Plan.build(args.config, args.out, args.requests, args.duration, args.rates, args.quick, args.only,
                      route=args.route, rounds=args.rounds, burst=args.burst)
    plan.transport = ours.transport
    use_mqtt5_clients()
    results = run_bench(plan, Rumqttd)
    results["meta"]["broker"] = "rumqttd"
    for path in write_outputs(results, args.out):
        print(f"wrote {path}", file=sys.stderr)
    print(summary(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
