#!/usr/bin/env python3
"""Where a request's time goes inside the daemon in an open loop: read -> taken by a worker ->
reply queued -> reply written to the socket, per request, as percentiles.

    .venv/bin/python tools/dev/trace_latency.py [--route gunpoint] [--duration 5]

Runs `edge-inferd bench e2e --only openloop1000` (1,000 distinct requests/s, the config as
written: the v5 link, native), with the daemon's child process timing four points with
`time.perf_counter_ns` (a `sitecustomize` put on its PYTHONPATH wraps them; nothing in the daemon
changes): `NativeLink._convert` (read, the network thread), `WorkerPool.take` (the batch taken),
`NativeLink.reply` (the reply queued) and `Connection.send` of a write holding PUBLISH packets
(written; a joined write holds several). At 1,000/s the requests come one at a time, so the
i-th of each point is the i-th request's; a reply's write is the first such write after it.
The last 5,000 requests are reported.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

TRACER = '''
import atexit, json, os, sys, time
from pathlib import Path
if "run" in sys.argv and os.environ.get("TRACE_LATENCY_OUT"):
    from daemon.serve.workers import WorkerPool
    from daemon.transport.native import NativeLink
    from daemon.transport.native_conn import Connection
    ns, points = time.perf_counter_ns, {"read": [], "take": [], "reply": [], "write": [], "published": []}

    def before(cls, name, key):
        real, times = getattr(cls, name), points[key]
        def timed(self, *a, **k):
            times.append(ns())
            return real(self, *a, **k)
        setattr(cls, name, timed)

    def take(self, real=WorkerPool.take):
        batch = real(self)
        points["take"].extend([ns()] * len(batch or ()))
        return batch

    def publishes(buf):
        """The PUBLISH packets in a write (a joined write holds several packets)."""
        pos, found = 0, 0
        while pos < len(buf):
            found += buf[pos] & 0xF0 == 0x30
            length, shift, pos = 0, 0, pos + 1
            while pos < len(buf):
                byte, pos = buf[pos], pos + 1
                length |= (byte & 0x7F) << shift
                shift += 7
                if not byte & 0x80:
                    break
            pos += length
        return found

    def send(self, data, real=Connection.send):
        found = publishes(bytes(data))
        if found:
            points["write"].append(ns())
            points["published"].append(found)
        return real(self, data)

    def convert(packet, real=NativeLink._convert):
        points["read"].append(ns())
        return real(packet)

    before(NativeLink, "reply", "reply")
    NativeLink._convert = staticmethod(convert)
    WorkerPool.take, Connection.send = take, send
    atexit.register(lambda: Path(os.environ["TRACE_LATENCY_OUT"]).write_text(json.dumps(points)))
'''

LAST = 5000


def _pct(values: np.ndarray) -> str:
    p50, p90, p99, top = np.percentile(values / 1000.0, [50, 90, 99, 100])
    return f"p50 {p50:6.0f}  p90 {p90:6.0f}  p99 {p99:6.0f}  max {top:7.0f} µs"


def report(points: dict) -> list[str]:
    n = min(len(points["read"]), len(points["take"]), len(points["reply"]), LAST)
    read, take, reply = (np.array(points[k][-n:], dtype=np.int64) for k in ("read", "take", "reply"))
    writes = np.array(points["write"], dtype=np.int64)
    at = np.searchsorted(writes, reply)
    ok = at < len(writes)
    written = writes[at[ok]]
    counts = ", ".join([f"{len(points[k])} {k}" for k in ("read", "take", "reply")]
                       + [f"{sum(points['published'])} published in {len(points['write'])} writes"])
    return [f"{counts}; the last {n} requests:",
            f"read -> taken by a worker : {_pct(take - read)}",
            f"taken -> reply queued     : {_pct(reply - take)}",
            f"reply queued -> written   : {_pct(written - reply[ok])}",
            f"read -> written           : {_pct(written - read[ok])}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--route", default="gunpoint")
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--config", default=str(ROOT / "config.yaml"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trace-latency-") as tmp:
        (Path(tmp) / "sitecustomize.py").write_text(TRACER)
        out = Path(tmp) / "points.json"
        env = {**os.environ, "TRACE_LATENCY_OUT": str(out),
               "PYTHONPATH": os.pathsep.join(filter(None, [tmp, str(ROOT), os.environ.get("PYTHONPATH")]))}
        bench = subprocess.run([sys.executable, "-m", "daemon", "bench", "e2e", "--config", args.config,
                                "--route", args.route, "--only", "openloop1000", "--duration", str(args.duration),
                                "--out", str(Path(tmp) / "bench")], env=env, cwd=ROOT, capture_output=True,
                               text=True, check=False)
        if bench.returncode != 0 or not out.exists():
            sys.exit(f"bench failed (exit {bench.returncode}):\n{bench.stdout[-2000:]}{bench.stderr[-2000:]}")
        print("\n".join(line for line in bench.stdout.splitlines() if line.startswith("openloop1000")))
        print("\n".join(report(json.loads(out.read_text()))))


if __name__ == "__main__":
    main()
