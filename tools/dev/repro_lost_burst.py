"""Try to reproduce the bench's `daemon-b1` lost burst (docs/performance.md, "A defect seen, not explained").

One private mosquitto, the bench's `daemon-b1` daemon (batching off, 2 workers, cache off,
`max_wait_ms: 2000`, a clean session), the bench's own collector (`mosquitto_sub -q 1`, a wide window) and one unpaced
`mosquitto_pub -l -q 1` burst of distinct requests, `--runs` times or until one run loses
replies. A run ends when every reply is in or none came for `--settle` seconds. A lossy run
keeps its daemon log and mosquitto's (`--keep`) and prints the daemon's own last stats beside what the
collector heard, which says on which side of the broker the replies went missing, and a timeline:
the daemon's stats every STATS_INTERVAL_S (received, answered, its queue and hold, its replies the
broker has not confirmed) beside the replies heard by then, which says when and where they stalled.

    python tools/dev/repro_lost_burst.py --route activity --requests 30000 --runs 10
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from daemon.obs.stats_topic import stopped_stats
from daemon.tools.bench.e2e import BATCH_OFF
from daemon.tools.bench.load import Collector, LinePublisher, subscriber
from daemon.tools.bench.phases import start_daemon
from daemon.tools.bench.workload import build_workload
from daemon.tools.broker import Broker, end_process

CLIENT_ID = "repro-b1"
STATS_INTERVAL_S = 0.5  # the daemon's stats this often: a lossy run's timeline (10 s by default)


def _fate(exit_code: int | None) -> str:
    return "was still running" if exit_code is None else f"had exited with {exit_code}"


class StatsTimeline:
    """The daemon's stats as it publishes them (every STATS_INTERVAL_S), each stamped when heard."""

    def __init__(self, address: str, client_id: str):
        self._proc = subscriber(address, f"edge-inferd/{client_id}/stats")
        self.seen: list[tuple[float, dict]] = []
        threading.Thread(target=self._read, name="stats", daemon=True).start()

    def _read(self) -> None:
        for line in self._proc.stdout:
            try:
                self.seen.append((time.perf_counter(), json.loads(line)))
            except ValueError:  # not stats (a retained clear is an empty line)
                continue

    def close(self) -> None:
        end_process(self._proc)


def _timeline(start: float, stats: StatsTimeline, collector: Collector) -> list[str]:
    """Per stats snapshot: what the daemon had received and answered, its queue and its unconfirmed
    replies, beside how many replies the collector had heard by then. A row is stamped when heard
    (`up`, the daemon's uptime, says when it was taken): stats queue behind the replies, so a row
    heard late says the replies were late too."""
    heard = sorted(reply.at for reply in collector.by_id.values())
    rows = []
    for at, s in stats.seen:
        queue, outbox = s.get("queue", {}), s.get("outbox", {})
        rows.append(f"  {at - start:6.2f} s (up {s.get('uptime_s', 0):5.1f} s)  received {s.get('received')}  "
                    f"results {s.get('results')}  errors {sum(s.get('errors', {}).values())}  queue {queue.get('depth')} "
                    f"({queue.get('bytes', 0) // 1024} KiB, holding {queue.get('holding')})  "
                    f"unconfirmed {outbox.get('unconfirmed')}  heard {bisect.bisect_right(heard, at)}")
    return rows


def _keep(keep: Path, log: Path, broker: Broker) -> str:
    keep.write_bytes(log.read_bytes())
    broker_log = keep.with_suffix(".broker.log")
    broker_log.write_bytes(broker.log_path.read_bytes())
    return f"the daemon's log is in {keep}, the broker's in {broker_log}"


def one_run(config: Path, route: str, n: int, settle_s: float, keep: Path, timeline: bool = False) -> bool:
    workload = build_workload(config, route)
    # notice: each client's connect and disconnect, and why; information: each autosave of the broker's db
    with Broker(log_types=("notice", "information")) as broker, \
            tempfile.TemporaryDirectory(prefix="repro-lost-burst-") as tmp:
        work = Path(tmp)
        burst = work / "burst.jsonl"
        burst.write_bytes(b"".join(workload.line(i) for i in range(n)))
        collector = Collector(broker.address, workload.reply_topic)  # the bench's own, as in its drains
        stats = StatsTimeline(broker.address, CLIENT_ID)
        log = work / "daemon.log"
        daemon = start_daemon(config, work, CLIENT_ID, {**BATCH_OFF, "stats_interval_s": STATS_INTERVAL_S},
                              broker.address, log)
        publisher = LinePublisher(broker.address, workload.request_topic)
        start = time.perf_counter()
        try:
            publisher.send_file(burst)
            collector.settle(lambda: len(collector.by_id) >= n, settle_s)
            collector_exit = collector.exit_code()
        finally:
            publisher.close()
            daemon.stop()
            collector.close()
            stats.close()
        heard = len(collector.by_id)
        last = stopped_stats(log.read_text(errors="replace")) or {}
        print(f"collector heard {heard} of {n}; the daemon received {last.get('received')}, results "
              f"{last.get('results')}, errors {last.get('errors')}, reconnects {last.get('reconnects')}, "
              f"outbox {last.get('outbox')}; the collector {_fate(collector_exit)}", flush=True)
        if heard < n or timeline:
            print("\n".join(["timeline from the burst's start:", *_timeline(start, stats, collector)]))
        if heard < n:
            print(f"not heard within {settle_s:g} s of silence: {n - heard}; {_keep(keep, log, broker)}")
            return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=ROOT / "config.yaml")
    parser.add_argument("--route", default="activity")
    parser.add_argument("--requests", type=int, default=30000)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--settle", type=float, default=5.0, help="seconds without a reply that end a run")
    parser.add_argument("--timeline", action="store_true", help="print every run's timeline, not only a lossy one's")
    parser.add_argument("--keep", type=Path, default=Path("repro-lost-burst.log"))
    args = parser.parse_args()
    for k in range(args.runs):
        print(f"run {k + 1} of {args.runs}", flush=True)
        if not one_run(args.config, args.route, args.requests, args.settle, args.keep, args.timeline):
            return 1
    print(f"no run lost a reply in {args.runs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
