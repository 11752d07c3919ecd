"""`edge-inferd bench soak`: the real daemon under open-loop load at a share of its capacity, for minutes.

    edge-inferd bench soak [--minutes 10] [--load 0.8] [--out soak.json] [--config config.yaml]

A private mosquitto (daemon/tools/broker.py) and `edge-inferd run` on a copy of the config
(config.yaml in the current directory by default; it needs the activity and appliance models)
(a private cache dir, a clean session). Capacity is measured first by a closed drain of
`--capacity-requests`; then requests are written to two unpaced `mosquitto_pub -l`
clients (activity and appliance routes, alternating) at `--load` x capacity. Inputs are
the models' test rows with a fresh random head each (a new cache key; `--repeat-share`
of them resend the route's previous data, cache hits). Every ~5 s the daemon's RSS,
open fds and threads are read from /proc. Exit 1 unless, after the warm-up (1 minute,
or 10% of a shorter run): RSS grew < 10 MB, fds and threads stayed within 2, no request
went unanswered, and no reply was an error other than `overloaded`/`expired`.
`--minutes 0.5` is a quick smoke.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from daemon.config.loader import load_config
from daemon.obs.stats_topic import stopped_stats
from daemon.tools.bench.load import Collector, LinePublisher, drain_summary, json_line, last_reply, outcome, require_clients
from daemon.tools.bench.phases import NOISE_STD, start_daemon
from daemon.tools.broker import Broker

CLIENT_ID = "soak"
REPLY_FILTER = "results/soak/#"
# (model, request topic, values replaced per request): the replaced head spans one
# downsampling group, so each request quantizes to a new INT8 input, a new cache key.
ROUTES = (("activity", "sensors/soak/imu", 12), ("appliance", "plugs/soak/power", 5))
SAMPLE_S = 5.0
PROGRESS_S = 30.0
WARMUP_MAX_S = 60.0
WARMUP_SHARE = 0.1
RSS_GROWTH_MAX_MB = 10.0
FLAT_MAX = 2  # fds and threads may move this much after the warm-up
SETTLE_S = 30.0  # after the last request, wait this long without a new reply before counting
WARMUP_REQUESTS = 20
WARMUP_TIMEOUT_S = 60.0
# The memory LRU is bounded (cache.memory_mb); a small one fills within the warm-up, so
# growth after it is not the cache filling up as designed.
CACHE_MEMORY_MB = 4
SEED = 11
KB = 1024
PACKAGE_PARENT = Path(__file__).resolve().parents[3]  # the folder that holds daemon/


class CountingIds(dict):
    """Collector.by_id keeps the first reply per id; this counts the ones after it."""

    def __init__(self):
        super().__init__()
        self.duplicates = 0

    def setdefault(self, key, default=None):
        if key in self:
            self.duplicates += 1
            return self[key]
        return super().setdefault(key, default)


class Requests:
    """JSON lines for both routes: test rows, each with a fresh random head."""

    def __init__(self, config_path: Path, repeat_share: float, seed: int = SEED):
        self.rng = np.random.default_rng(seed)
        self.repeat_share = repeat_share
        self.rows, self.tails = [], []
        models = load_config(config_path).models
        for model, _, head in ROUTES:
            with np.load(models[model].path.parent / "test.npz", allow_pickle=False) as data:
                rows = data["x"].reshape(len(data["x"]), -1).astype(np.float64)
            self.rows.append(rows)
            self.tails.append([("," + json.dumps(np.round(r[head:], 3).tolist())[1:]).encode() for r in rows])
        self._last: list[Optional[bytes]] = [None] * len(ROUTES)

    def line(self, request_id: int) -> tuple[int, bytes]:
        """(route index, the request line); ids alternate between the routes."""
        route = request_id % len(ROUTES)
        data = self._last[route]
        if data is None or self.rng.random() >= self.repeat_share:
            pick = int(self.rng.integers(len(self.rows[route])))
            head = self.rows[route][pick][: ROUTES[route][2]] + self.rng.normal(0.0, NOISE_STD, ROUTES[route][2])
            data = b"[" + ",".join("%.3f" % v for v in head).encode() + self.tails[route][pick]
            self._last[route] = data
        return route, json_line(request_id, data)


def read_proc(pid: int) -> dict:
    """RSS (total, anonymous, file-backed, MB), open fds and threads of a process."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)

    def mb(key: str) -> float:
        return int(fields.get(key, "0 kB").split()[0]) / KB

    return {"rss_mb": mb("VmRSS"), "anon_mb": mb("RssAnon"), "file_mb": mb("RssFile"),
            "fds": len(os.listdir(f"/proc/{pid}/fd")), "threads": int(fields["Threads"])}


def read_stats(address: str) -> dict:
    """The daemon's retained stats: replies awaiting PUBACK (`outbox`), queue depth, received."""
    host, port = address.rsplit(":", 1)
    out = subprocess.run(["mosquitto_sub", "-h", host, "-p", port, "-t", f"edge-inferd/{CLIENT_ID}/stats",
                          "-C", "1", "-W", "2"], capture_output=True, check=False).stdout
    try:
        stats = json.loads(out)
    except ValueError:
        return {}
    return {"received": stats.get("received"), "outbox": stats.get("outbox"),
            "queue_depth": (stats.get("queue") or {}).get("depth")}


class Sampler:
    """/proc figures of one process, and its retained stats, every `interval_s`, in a thread."""

    def __init__(self, pid: int, address: str, interval_s: float = SAMPLE_S):
        self.pid, self.address, self.interval_s = pid, address, interval_s
        self.start = time.monotonic()
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                sample = {"t": round(time.monotonic() - self.start, 1), **read_proc(self.pid)}
            except (OSError, KeyError):
                return  # the process is gone
            self.samples.append({**sample, **read_stats(self.address)})
            if self._stop.wait(self.interval_s):
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def resources(self, warmup_s: float) -> dict:
        """Growth and ranges over the samples taken after the warm-up."""
        after = [s for s in self.samples if s["t"] >= warmup_s] or self.samples[-1:]
        out: dict = {"warmup_s": warmup_s, "samples": len(after)}
        for key in ("rss_mb", "anon_mb", "file_mb"):
            values = [s[key] for s in after]
            out[key] = {"first": values[0], "last": values[-1], "min": min(values), "max": max(values),
                        "growth": round(values[-1] - values[0], 2), "range": round(max(values) - min(values), 2)}
        for key in ("fds", "threads"):
            values = [s[key] for s in after]
            out[key] = {"min": min(values), "max": max(values)}
        return out


class Soak:
    """The broker, the daemon, the collector and two publishers, for one run."""

    def __init__(self, config_path: Path, address: str, workdir: Path, requests: Requests):
        self.address, self.requests = address, requests
        self.collector = Collector(address, REPLY_FILTER)
        self.collector.by_id = CountingIds()  # before any request is sent, so no reply is missed
        overrides = {"cache": {"memory_mb": CACHE_MEMORY_MB}, "stats_interval_s": SAMPLE_S}
        # The child imports this same package (a checkout's, where it runs from one).
        self.daemon = start_daemon(config_path, workdir, CLIENT_ID, overrides, address, workdir / "daemon.log",
                                   pythonpath=PACKAGE_PARENT)
        self.pubs = [LinePublisher(address, topic) for _, topic, _ in ROUTES]
        self.next_id = 0

    def ids(self, n: int) -> range:
        first, self.next_id = self.next_id, self.next_id + n
        return range(first, first + n)

    def send(self, request_id: int) -> None:
        route, line = self.requests.line(request_id)
        self.pubs[route].send(line)

    def warm(self) -> None:
        """Negative ids on both publishers: connected, subscribed, models warm."""
        before = self.collector.probes
        for k in range(WARMUP_REQUESTS):
            self.send(-1 - k)
        if not self.collector.wait(lambda: self.collector.probes - before >= WARMUP_REQUESTS, WARMUP_TIMEOUT_S):
            raise SystemExit(f"warm-up requests not answered within {WARMUP_TIMEOUT_S:.0f}s; see {self.daemon.log}")

    def capacity(self, n: int) -> dict:
        """A closed drain: n requests written at once, answered req/s from the first write to the last reply."""
        ids = self.ids(n)
        lines: list[list[bytes]] = [[] for _ in ROUTES]
        for i in ids:
            route, line = self.requests.line(i)
            lines[route].append(line)
        chunks = [b"".join(route_lines) for route_lines in lines]
        by_id = self.collector.by_id
        cpu0, start = self.daemon.cpu_s(), time.perf_counter()
        writers = [threading.Thread(target=pub.send, args=(chunk,), daemon=True)
                   for pub, chunk in zip(self.pubs, chunks)]
        for w in writers:
            w.start()
        self.collector.settle(lambda: all(i in by_id for i in ids), SETTLE_S)
        for w in writers:
            w.join()
        cpu = self.daemon.cpu_s() - cpu0
        return drain_summary(outcome(self.collector, ids).summary(), start, last_reply(self.collector, ids), cpu)

    def paced(self, rate: float, seconds: float, progress: Callable[[int, int], None]) -> dict:
        """Open loop: request k is written at start + k / rate, whatever came back."""
        ids = self.ids(max(1, int(rate * seconds)))
        sent_at: dict[int, float] = {}
        start = last_progress = time.perf_counter()
        for k, i in enumerate(ids):
            delay = start + k / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            sent_at[i] = time.perf_counter()
            self.send(i)
            if sent_at[i] - last_progress >= PROGRESS_S:
                last_progress = sent_at[i]
                progress(k + 1, sum(1 for j in range(ids.start, i + 1) if j in self.collector.by_id))
        sent_s = time.perf_counter() - start
        self.collector.settle(lambda: all(i in self.collector.by_id for i in ids), SETTLE_S)
        summary = outcome(self.collector, ids, sent_at).summary()
        summary.update(rate=round(rate, 1), offered_rps=round(len(ids) / max(sent_s, 1e-9), 1),
                       seconds=round(sent_s, 1), duplicates=self.collector.by_id.duplicates)
        return summary

    def close(self) -> dict:
        """Stop everything; the daemon's own final stats."""
        try:
            for pub in self.pubs:
                pub.close()
        finally:  # a signal while the publishers drain must not leave the daemon running
            code = self.daemon.stop()
            self.collector.close()
        return {"exit_code": code, "stats": stopped_stats(self.daemon.log.read_text(errors="replace"))}


def checks(load: dict, resources: dict) -> dict[str, bool]:
    """The pass conditions, by name."""
    return {
        f"RSS growth after warm-up < {RSS_GROWTH_MAX_MB:g} MB": resources["rss_mb"]["growth"] < RSS_GROWTH_MAX_MB,
        f"fds flat (max - min <= {FLAT_MAX})": resources["fds"]["max"] - resources["fds"]["min"] <= FLAT_MAX,
        f"threads flat (max - min <= {FLAT_MAX})":
            resources["threads"]["max"] - resources["threads"]["min"] <= FLAT_MAX,
        "no request unanswered": load["lost"] == 0,
        "no error reply but overloaded/expired": load["other_errors"] == 0,
    }


def print_summary(report: dict) -> None:
    cap, load, res = report["capacity"], report["load"], report["resources"]
    rows = [
        ("capacity (closed drain)", f"{cap['rps']:.0f} req/s over {cap['answered']} requests"),
        ("open loop", f"{load['rate']:.0f} req/s target, {load['offered_rps']:.0f} offered, {load['seconds']:.0f} s"),
        ("sent / answered / lost", f"{load['sent']} / {load['answered']} / {load['lost']}"),
        ("results (cache hits)", f"{load['results']} ({load['cache_hits']})"),
        ("overloaded / expired / other errors", f"{load['overloaded']} / {load['expired']} / {load['other_errors']}"),
        ("duplicate replies", str(load["duplicates"])),
        ("result round trip p50 / p99 ms", f"{load['result_rtt_ms']['p50']} / {load['result_rtt_ms']['p99']}"),
    ]
    for key in ("rss_mb", "anon_mb", "file_mb"):
        r = res[key]
        rows.append((f"{key} after warm-up", f"{r['first']:.1f} -> {r['last']:.1f}, growth {r['growth']:+.1f}, "
                                               f"range {r['min']:.1f}..{r['max']:.1f}"))
    rows += [("fds min..max", f"{res['fds']['min']}..{res['fds']['max']}"),
             ("threads min..max", f"{res['threads']['min']}..{res['threads']['max']}")]
    rows += [(name, "pass" if ok else "FAIL") for name, ok in report["checks"].items()]
    width = max(len(name) for name, _ in rows)
    print("\n".join(f"{name:<{width}}  {value}" for name, value in rows), flush=True)


def run(args: argparse.Namespace, workdir: Path) -> dict:
    seconds = args.minutes * 60.0
    warmup_s = min(WARMUP_MAX_S, WARMUP_SHARE * seconds)
    if args.warmup_minutes is not None:
        warmup_s = args.warmup_minutes * 60.0
    with Broker(workdir / "broker") as broker:
        soak = Soak(args.config, broker.address, workdir, Requests(args.config, args.repeat_share))
        try:
            soak.warm()
            capacity = soak.capacity(args.capacity_requests)
            rate = args.load * capacity["rps"]
            print(f"capacity {capacity['rps']:.0f} req/s; open loop at {rate:.0f} req/s for {seconds:.0f} s",
                  flush=True)
            sampler = Sampler(soak.daemon.proc.pid, broker.address)

            def progress(sent: int, answered: int) -> None:
                last = sampler.samples[-1] if sampler.samples else {}
                print(f"{time.monotonic() - sampler.start:6.0f} s  sent {sent}  answered {answered}  "
                      f"RSS {last.get('rss_mb', 0):.1f} MB  daemon received {last.get('received')} "
                      f"outbox {last.get('outbox')} queue {last.get('queue_depth')}", flush=True)

            load = soak.paced(rate, seconds, progress)
            sampler.stop()
        finally:
            daemon = soak.close()
    resources = sampler.resources(warmup_s)
    report = {"minutes": args.minutes, "load": load, "capacity": capacity, "resources": resources,
              "daemon": daemon, "samples": sampler.samples}
    report["checks"] = checks(load, resources)
    return report


def main(args: argparse.Namespace) -> int:
    """Run a soak (edge-inferd bench soak's options, daemon/cli_parser.py); 0 when every check passes."""
    require_clients()
    # SIGTERM (and SIGINT, which a shell leaves ignored in background jobs) end the run
    # through the `finally` blocks, so the broker, the daemon and the clients are stopped.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sys.exit(130))
    args.config = args.config.resolve()
    workdir = Path(tempfile.mkdtemp(prefix="edge-inferd-soak-"))
    try:
        report = run(args, workdir)
    finally:
        if args.keep:
            print(f"work dir kept: {workdir}", flush=True)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print_summary(report)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return 0 if all(report["checks"].values()) else 1
