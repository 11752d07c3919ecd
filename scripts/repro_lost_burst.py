"""Try to reproduce the bench's `daemon-b1` lost burst (docs/performance.md, "A defect seen, not explained").

One private mosquitto, the bench's `daemon-b1` daemon (batching off, 2 workers, cache off,
`max_wait_ms: 2000`, a clean session), the bench's own collector (`mosquitto_sub -q 1`, a wide window) and one unpaced
`mosquitto_pub -l -q 1` burst of distinct requests, `--runs` times or until one run loses
replies. A run ends when every reply is in or none came for `--settle` seconds. A lossy run
keeps its daemon log (`--keep`) and prints the daemon's own last stats beside what the
collector heard, which says on which side of the broker the replies went missing.

    python scripts/repro_lost_burst.py --route activity --requests 30000 --runs 10
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from daemon.tools.bench.e2e import BATCH_OFF
from daemon.tools.bench.load import Collector, LinePublisher
from daemon.tools.bench.phases import start_daemon
from daemon.tools.bench.workload import build_workload
from daemon.tools.broker import Broker


def _last_stats(log: Path) -> dict:
    for line in reversed(log.read_text(errors="replace").splitlines()):
        if "stopped; stats " in line:
            return json.loads(line.split("stopped; stats ", 1)[1])
    return {}


def _fate(exit_code: Optional[int]) -> str:
    return "was still running" if exit_code is None else f"had exited with {exit_code}"


def one_run(config: Path, route: str, n: int, settle_s: float, keep: Path) -> bool:
    workload = build_workload(config, route)
    # at notice, mosquitto logs each client's connect and disconnect, and why
    with Broker(settings={"log_type": "notice"}) as broker, \
            tempfile.TemporaryDirectory(prefix="repro-lost-burst-") as tmp:
        work = Path(tmp)
        burst = work / "burst.jsonl"
        burst.write_bytes(b"".join(workload.line(i) for i in range(n)))
        collector = Collector(broker.address, workload.reply_topic)  # the bench's own, as in its drains
        log = work / "daemon.log"
        daemon = start_daemon(config, work, "repro-b1", BATCH_OFF, broker.address, log)
        publisher = LinePublisher(broker.address, workload.request_topic)
        try:
            publisher.send_file(burst)
            collector.settle(lambda: len(collector.by_id) >= n, settle_s)
            collector_exit = collector.exit_code()
        finally:
            publisher.close()
            daemon.stop()
            collector.close()
        heard = len(collector.by_id)
        stats = _last_stats(log)
        print(f"collector heard {heard} of {n}; the daemon received {stats.get('received')}, results "
              f"{stats.get('results')}, errors {stats.get('errors')}, reconnects {stats.get('reconnects')}, "
              f"outbox {stats.get('outbox')}; the collector {_fate(collector_exit)}", flush=True)
        if heard < n:
            keep.write_bytes(log.read_bytes())
            broker_log = keep.with_suffix(".broker.log")
            broker_log.write_bytes(broker.log_path.read_bytes())
            print(f"lost {n - heard}: the daemon's log is in {keep}, the broker's in {broker_log}")
            return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=ROOT / "config.yaml")
    parser.add_argument("--route", default="activity")
    parser.add_argument("--requests", type=int, default=30000)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--settle", type=float, default=5.0, help="seconds without a reply that end a run")
    parser.add_argument("--keep", type=Path, default=Path("repro-lost-burst.log"))
    args = parser.parse_args()
    for k in range(args.runs):
        print(f"run {k + 1} of {args.runs}", flush=True)
        if not one_run(args.config, args.route, args.requests, args.settle, args.keep):
            return 1
    print(f"no run lost a reply in {args.runs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
